"""What Slurm does to `srun ... torchrun` when the job is cancelled or srun is interrupted.

Starts `srun --job-name=<unique> --nodes=1 --ntasks=1 python -m torch.distributed.run --standalone
--nproc_per_node=2 allreduce_probe.py` with the ranks holding (PROBE_HOLD_S) and logging every
signal they receive (PROBE_SIGNAL_LOG), finds the job id by its name (squeue), lists the step's
processes (`scontrol listpids`), then does the --action and prints a timeline: the signals each
rank received, when each process of the step ended, srun's exit code and last lines, and any
process of the step that survived (those are then SIGKILLed). Needs a running Slurm
(scripts/slurm/single_host.sh). docs/guides/multi-node.md ("What torchrun and Slurm do") rests on it:

  python scripts/slurm/probe_cancel.py --action scancel
  python scripts/slurm/probe_cancel.py --action scancel --ignore-term     # ranks ignore SIGTERM
  python scripts/slurm/probe_cancel.py --action sigint                    # one SIGINT to srun
  python scripts/slurm/probe_cancel.py --action sigint2                   # two within a second
  python scripts/slurm/probe_cancel.py --action sigterm                   # SIGTERM to srun
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PROBE = os.path.join(HERE, "allreduce_probe.py")


def step_pids(job_id: str) -> dict[int, str]:
    """pid -> 'agent' (the task srun started, LOCALID 0) or 'worker', from scontrol listpids."""
    out = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True).stdout
    pids = {}
    for line in out.splitlines()[1:]:
        f = line.split()
        if len(f) >= 4 and f[0].isdigit():
            pids[int(f[0])] = "task" if f[3] != "-" else "child"
    return pids


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        return f"sid={os.getsid(pid)} pgid={os.getpgid(pid)} {cmd[:110]}"
    except OSError:
        return "(gone)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--action", choices=("scancel", "sigint", "sigint2", "sigterm"), default="scancel")
    ap.add_argument("--scancel-args", default="", help="extra scancel arguments, e.g. '--signal=USR1' or "
                                                       "'--signal=TERM --full' (with --action scancel)")
    ap.add_argument("--ignore-term", action="store_true", help="the ranks log and ignore SIGTERM/SIGINT")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds to watch after the action")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--strace", action="store_true",
                    help="attach `strace -e trace=none` to each process of the step: every signal it gets, "
                         "with the sender's pid (needs strace and ptrace permission)")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="probe_cancel_")
    siglog = os.path.join(work, "signals.log")
    out_path = os.path.join(work, "srun.out")
    name = f"probe-cancel-{os.getpid()}"
    env = dict(os.environ, PROBE_HOLD_S="600", PROBE_SIGNAL_LOG=siglog)
    if a.ignore_term:
        env["PROBE_IGNORE_TERM"] = "1"
    argv = ["srun", f"--job-name={name}", "--nodes=1", "--ntasks=1", sys.executable, "-m", "torch.distributed.run",
            "--standalone", f"--nproc_per_node={a.nproc}", PROBE]
    print("$", " ".join(argv), flush=True)
    out = open(out_path, "w")
    t_launch = time.monotonic()
    srun = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    job_id = ""
    while time.monotonic() - t_launch < 120:
        if not job_id:
            job_id = subprocess.run(["squeue", "--noheader", f"--name={name}", "--format=%i"],
                                    capture_output=True, text=True).stdout.strip()
            if job_id:
                print(f"job id {job_id} (squeue --noheader --name={name} --format=%i, "
                      f"{time.monotonic() - t_launch:.1f} s after srun started)", flush=True)
        with open(out_path) as f:
            if f.read().count("PROBE-START") >= a.nproc:
                break
        if srun.poll() is not None:
            print(f"srun ended early rc={srun.returncode}:\n" + open(out_path).read())
            return 1
        time.sleep(0.2)
    else:
        print("the ranks did not start within 120 s")
    pids = step_pids(job_id)
    print(f"scontrol listpids {job_id}:")
    for pid, kind in pids.items():
        print(f"  {pid} {kind:5s} {describe(pid)}")
    print(f"srun pid {srun.pid}")
    tracers = []
    if a.strace:
        for pid in pids:
            tracers.append(subprocess.Popen(["strace", "-f", "-tt", "-e", "trace=none", "-o", os.path.join(work, f"strace.{pid}"),
                                             "-p", str(pid)], stderr=subprocess.DEVNULL))
        time.sleep(1.0)

    t0 = time.monotonic()
    wall0 = time.time()
    if a.action == "scancel":
        print(f"[   0.0 s] $ scancel {a.scancel_args + ' ' if a.scancel_args else ''}{job_id}", flush=True)
        subprocess.run(["scancel", *a.scancel_args.split(), job_id], check=True)
    elif a.action == "sigint":
        print(f"[   0.0 s] SIGINT to srun ({srun.pid})", flush=True)
        srun.send_signal(signal.SIGINT)
    elif a.action == "sigint2":
        print(f"[   0.0 s] SIGINT to srun ({srun.pid}), again 0.3 s later", flush=True)
        srun.send_signal(signal.SIGINT)
        time.sleep(0.3)
        srun.send_signal(signal.SIGINT)
    elif a.action == "sigterm":
        print(f"[   0.0 s] SIGTERM to srun ({srun.pid})", flush=True)
        srun.send_signal(signal.SIGTERM)
    gone: dict[int, float] = {}
    srun_end = None
    while time.monotonic() - t0 < a.limit:
        for pid in pids:
            if pid not in gone and not alive(pid):
                gone[pid] = time.monotonic() - t0
                print(f"[{gone[pid]:6.1f} s] pid {pid} ({pids[pid]}) gone", flush=True)
        if srun_end is None and srun.poll() is not None:
            srun_end = time.monotonic() - t0
            print(f"[{srun_end:6.1f} s] srun exited rc={srun.returncode}", flush=True)
        if srun_end is not None and len(gone) == len(pids):
            break
        time.sleep(0.1)
    print("signals the ranks logged (time after the action):")
    if os.path.exists(siglog):
        for line in open(siglog):
            t, rest = line.split(" ", 1)
            print(f"  [{float(t) - wall0:6.1f} s] {rest.rstrip()}")
    else:
        print("  none")
    for t in tracers:
        try:
            t.wait(timeout=5)
        except subprocess.TimeoutExpired:
            t.kill()
    for pid in pids if a.strace else ():
        path = os.path.join(work, f"strace.{pid}")
        print(f"strace of {pid} ({pids[pid]}):")
        for line in open(path) if os.path.exists(path) else ():
            print("   ", line.rstrip()[:200])
    survivors = [p for p in pids if alive(p)]
    print(f"survivors after {time.monotonic() - t0:.1f} s: {survivors or 'none'}")
    if srun_end is None:
        print(f"srun still running after {a.limit:.0f} s")
    st = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    print("job:", " ".join(w for w in st.split() if w.startswith(("JobState=", "ExitCode="))) or "(gone)")
    print(f"--- srun output, last lines ({out_path}) ---")
    lines = [ln.rstrip() for ln in open(out_path) if ln.strip() and not ln.startswith(("  ", "PROBE-START"))]
    for ln in lines[-12:]:
        print("   ", ln[:240])
    if survivors or srun_end is None:
        subprocess.run(["scancel", "--signal=KILL", job_id])
        for p in survivors:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        if srun.poll() is None:
            os.killpg(srun.pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
