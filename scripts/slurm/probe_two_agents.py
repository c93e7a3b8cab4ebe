"""Two torchrun agents as two "nodes" on this host (c10d rendezvous on localhost), with a fault.

Prints a timeline: when each agent ended, its exit code, and the last lines of its log (torchrun's
own stderr and the workers' output), and lists any process of the run still alive at the end.
docs/guides/multi-node.md ("What torchrun and Slurm do") rests on it:

  python scripts/slurm/probe_two_agents.py                          # healthy
  python scripts/slurm/probe_two_agents.py --only-node 0 --rdzv-conf join_timeout=10
  python scripts/slurm/probe_two_agents.py --fault hang --pg-timeout 20 [--fault-rank 0]
  python scripts/slurm/probe_two_agents.py --fault kill
  python scripts/slurm/probe_two_agents.py --kill-worker-after 8    # SIGKILL node 1's worker from outside

The rank that faults is rank 1 unless --fault-rank says 0; with c10d, rank order follows join order, not
--node_rank, so the script starts node 0 first and waits a moment before node 1.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "allreduce_probe.py")


def children(pid: int) -> list[int]:
    """Every live descendant of pid, read from /proc."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--rdzv-id", default=f"probe{os.getpid()}")
    ap.add_argument("--rdzv-conf", default="", help="passed as --rdzv_conf=... to both agents")
    ap.add_argument("--only-node", type=int, choices=(0, 1), help="start only this agent (the other never joins)")
    ap.add_argument("--fault", choices=("hang", "exit", "kill"), help="what the faulting rank does (PROBE_FAULT)")
    ap.add_argument("--fault-rank", type=int, default=1, help="the rank that faults (0 = node 0, the store host)")
    ap.add_argument("--fault-after", type=float, default=0.0)
    ap.add_argument("--pg-timeout", type=float, default=1800.0, help="gloo process-group timeout (s)")
    ap.add_argument("--kill-worker-after", type=float, help="SIGKILL node 1's worker this many s after it starts")
    ap.add_argument("--limit", type=float, default=180.0, help="SIGKILL everything still running after this (s)")
    ap.add_argument("--log-dir", default="/tmp/probe_two_agents")
    a = ap.parse_args()

    os.makedirs(a.log_dir, exist_ok=True)
    env = dict(os.environ, PROBE_PG_TIMEOUT_S=str(a.pg_timeout))
    if a.fault:
        env.update(PROBE_FAULT=a.fault, PROBE_FAULT_RANK=str(a.fault_rank), PROBE_FAULT_AFTER_S=str(a.fault_after))
    base = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            "--rdzv_backend=c10d", f"--rdzv_endpoint=localhost:{a.port}", f"--rdzv_id={a.rdzv_id}"]
    if a.rdzv_conf:
        base.append(f"--rdzv_conf={a.rdzv_conf}")
    t0 = time.monotonic()
    agents: dict[int, subprocess.Popen] = {}
    logs = {}
    for node in (0, 1):
        if a.only_node is not None and node != a.only_node:
            continue
        logs[node] = open(os.path.join(a.log_dir, f"node{node}.log"), "w")
        argv = [*base, f"--node_rank={node}", PROBE]
        if node == (a.only_node if a.only_node is not None else 0):
            print("$", " ".join(argv), flush=True)
        agents[node] = subprocess.Popen(argv, env=env, stdout=logs[node], stderr=subprocess.STDOUT,
                                        start_new_session=True)
        time.sleep(2.0)
    ended: dict[int, tuple[float, int]] = {}
    killed_worker = False
    all_pids = set()
    while len(ended) < len(agents) and time.monotonic() - t0 < a.limit:
        for node, p in agents.items():
            all_pids.update(children(p.pid))
            if node not in ended and p.poll() is not None:
                ended[node] = (time.monotonic() - t0, p.returncode)
                print(f"[{ended[node][0]:6.1f} s] node {node} agent exited rc={p.returncode}", flush=True)
        if a.kill_worker_after is not None and not killed_worker and 1 in agents:
            with open(logs[1].name) as f:
                started = "PROBE-START" in f.read()
            if started:
                if not hasattr(main, "t_start"):
                    main.t_start = time.monotonic()
                elif time.monotonic() - main.t_start >= a.kill_worker_after:
                    w = children(agents[1].pid)
                    print(f"[{time.monotonic() - t0:6.1f} s] SIGKILL to node 1's worker(s) {w}", flush=True)
                    for pid in w:
                        os.kill(pid, signal.SIGKILL)
                    killed_worker = True
        time.sleep(0.2)
    for node, p in agents.items():
        if node not in ended:
            print(f"[{time.monotonic() - t0:6.1f} s] node {node} agent still running after --limit {a.limit:.0f} s: "
                  f"SIGKILL to its session", flush=True)
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    for node in agents:
        logs[node].close()
        with open(logs[node].name) as f:
            lines = [ln.rstrip() for ln in f if ln.strip() and not ln.startswith("  ")]
        print(f"--- node {node} log, last lines ({logs[node].name}) ---")
        for ln in lines[-14:]:
            print("   ", ln[:300])
    time.sleep(1.0)
    alive = []
    for pid in sorted(all_pids):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    print(f"survivors: {alive or 'none'}" + (" (SIGKILLed now)" if alive else ""))
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
