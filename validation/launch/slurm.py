"""A train point as ``srun`` of torchrun in a Slurm allocation (launcher kind ``slurm``): one task
per node, each a torchrun agent, meeting at a c10d rendezvous on the allocation's first node.

The allocation is the one the harness runs in (``SLURM_JOB_ID`` set: the point is a step of it),
else one the harness asks for with ``salloc --no-shell`` and releases when the point ends. Every
job and step the harness makes is named with the run's token (``--job-name``), so ``squeue
--name`` finds it without parsing srun's output; the job id goes into the point's record.

Before the trainer, one short step (``hostname`` on every node, its output written through
``srun --output`` into the run directory) checks that every node sees the run directory: every
rank writes its files there, so it must be on a filesystem all nodes share. It also tells which
host runs which task.

When the harness stops the run (a stall, the phase timeout) or is interrupted, it cancels the step
with ``scancel --signal=TERM`` (SIGTERM to the agents, which stop their workers), waits KillWait
and a margin for srun to end, then ``scancel --signal=KILL``, then kills what runs on this host as
for any point (docs/guides/multi-node.md, "What torchrun and Slurm do").

srun propagates the environment, so every process of the step carries the run's token: the nodes'
agents and ranks on this host (slurmstepd's children, not srun's) are found by it, for nodes.json
and for the stacks of a stall. A step Slurm ends without the harness asking (someone's scancel, the
job's time limit, preemption) leaves slurmstepd's '*** STEP ... CANCELLED AT ... ***' in the nodes'
logs; nodes.json records it (``slurm_stopped``), so that the verdict says so instead of a crash.

srun waits for every task, so a node's agent that gave up on the rendezvous does not end it while
another node's lives: a node frozen before the rendezvous would hold the point until the start-up
allowance. The launch is over (``_RendezvousClosed``, validation/launch/process.py's
``LaunchOver``) once srun reports a task's failure and that node's log says its agent gave up on
a rendezvous closed for good (as for agents launched here): the step is cancelled after the
launch-over grace, and the point ends as that task did.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from validation.contract.nodes import NodeLaunch, NodesLaunch, node_log, write_nodes
from validation.contract.torchrun_log import agent_said, closed_rendezvous, gave_up
from validation.errors import HarnessError
from validation.launch import commands
from validation.launch import process as runner
from validation.launch.commands import Target
from validation.launch.nodes import RankSeen
from validation.launch.tree import ProcessTree
from validation.launch.watch import Watch
from validation.runbook.types import Launcher

#: seconds beyond Slurm's KillWait that the harness waits for a cancelled step before SIGKILL
KILL_MARGIN_S = 5.0
#: seconds a Slurm query (squeue, scontrol, scancel) may take
QUERY_TIMEOUT_S = 30.0
#: seconds the check of the shared run directory may take (a step of ``hostname`` on every node)
SHARED_CHECK_S = 60.0
#: seconds between looks for the trainer's step while it is not listed yet
STEP_LOOK_S = 2.0
#: seconds between looks for the step's processes on this host by the run's token (a scan of every
#: process here, a few ms per hundred): often enough to see workers that live only a few seconds
RANK_LOOK_S = 0.5
#: seconds between looks at why Slurm holds the harness's own allocation request pending
PENDING_LOOK_S = 2.0
#: the store's port on the first node when the runbook names none: from the job id, below 29500
#: (torch's default master port) and below Linux's ephemeral ports (32768 and up)
PORT_BASE, PORT_SPAN = 20000, 9000
_TASK_END = re.compile(r"^srun: error: (?P<host>\S+): tasks? (?P<tasks>[\d,-]+): (?P<what>.+)$")
#: what slurmstepd writes into a task's stderr as Slurm ends its step or job (Slurm 22.05:
#: '*** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***', with ' DUE TO TIME LIMIT' and the like)
_STEPD_BANNER = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON \S+ CANCELLED AT .*?\*\*\*")
#: the job states squeue shows of a job that has ended, other than COMPLETED
JOB_ENDED = ("CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "DEADLINE", "BOOT_FAIL", "OUT_OF_MEMORY", "FAILED")
#: the state squeue shows of a job Slurm is ending (its nodes not yet done with it), in place of the
#: state it ends in
JOB_ENDING = "COMPLETING"
#: seconds the harness waits for an ending job to show the state it ended in, and between looks: srun
#: has returned, so what remains is each node's epilog and slurmctld's word on it
JOB_END_WAIT_S, JOB_END_LOOK_S = 10.0, 0.5
_SIGNALS = {"Killed": -9, "Terminated": -15, "Aborted": -6, "Segmentation fault": -11}


#: the Slurm commands a Slurm point needs on the harness's machine
TOOLS = ("salloc", "srun", "squeue", "scancel", "scontrol")


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def allocation_problem(launcher: Launcher) -> str | None:
    """Why the allocation the harness runs in (``SLURM_JOB_ID`` set) cannot hold the point: fewer
    nodes (``SLURM_JOB_NUM_NODES``) than the launcher's, or a job that is not running (a variable
    left in the shell by an allocation that has ended); None outside an allocation, where the
    harness asks for its own, and where Slurm is not installed (the point is SKIP). Without this,
    srun's refusal surfaced as the shared-directory check failing, which blames the filesystem."""
    job, have = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_JOB_NUM_NODES", "")
    if not job or missing_tools():
        return None
    if have.isdigit() and int(have) < launcher.nnodes:
        return (f"launcher.nodes is {launcher.nnodes}, but job {job}, the Slurm allocation the harness runs in, has "
                f"{have} node{'s' if int(have) != 1 else ''} (SLURM_JOB_NUM_NODES): ask for {launcher.nnodes} nodes "
                f"(salloc --nodes={launcher.nnodes}) or lower launcher.nodes")
    state = _job_state(job)
    if state != "RUNNING":
        return (f"SLURM_JOB_ID={job}, the Slurm allocation the harness runs in, is not a running job "
                f"({state or 'Slurm knows no such job'}): run inside a live allocation, or unset SLURM_JOB_ID and "
                "the harness asks for its own")
    return None


@dataclass(frozen=True)
class Allocation:
    job_id: str
    owned: bool
    """The harness asked for it (salloc --no-shell) and releases it when the point ends."""


def run(launcher: Launcher, target: Target, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
        timeout_s: float, out_dir: Path, on_poll: Callable[[float], None] | None, watch: Watch) -> runner.ProcResult:
    """The point as srun of torchrun; nodes.json written at the end. A HarnessError when no
    allocation, no shared run directory or no Slurm at all."""
    if missing_tools():
        raise HarnessError(f"Slurm's {', '.join(missing_tools())} not on PATH")
    tree = ProcessTree()
    name = tree.token
    start = time.monotonic()
    alloc = _allocation(launcher, name, env, cwd, timeout_s, out_dir)
    try:
        host = rendezvous_host(alloc.job_id)
        hosts = _shared_hosts(alloc, launcher.nnodes, name, env, cwd, out_dir, host)
        port = launcher.rdzv.port or PORT_BASE + int(alloc.job_id) % PORT_SPAN
        endpoint = f"{host or hosts[0]}:{port}"
        torchrun = commands.nodes_torchrun_argv(target, launcher.nproc, args, nnodes=launcher.nnodes, endpoint=endpoint,
                                                rdzv_id=out_dir.name, join_timeout_s=launcher.rdzv.join_timeout_s,
                                                torchrun_args=launcher.torchrun_args)
        argv = [*_srun(alloc, name, launcher), f"--output={out_dir}/node%t.stdout.log",
                f"--error={out_dir}/node%t.stderr.log", *torchrun]
        step = _StepSeen(alloc.job_id, name)
        # the ranks and agents of the nodes on this host: not srun's descendants (slurmstepd starts
        # them), found by the token every process of the step inherits through srun's environment
        seen = RankSeen(ProcessTree.members, RANK_LOOK_S)

        def observe(t: ProcessTree) -> None:
            step(t)
            seen(t)

        cancel = _Cancel(alloc, step, seen, kill_wait_s())
        result = runner.run_group([runner.Command(argv, "srun", forwards_signals=True)], env=env, cwd=cwd,
                                  timeout_s=max(1.0, timeout_s - (time.monotonic() - start)), log_dir=out_dir,
                                  on_poll=on_poll, watch=watch, tree=tree, on_tree=observe, cancel=cancel,
                                  over=_RendezvousClosed(out_dir / "srun.stderr.log", out_dir))
        ends = task_ends(result.stderr_path)
        code = result.exit_code
        nodes = []
        for i, host in enumerate(hosts):
            own = _agent_exit(i, ends, code, cancel)
            nodes.append(NodeLaunch(i, host, seen.agents.get(i), own, group_rank=seen.group.get(i),
                                    ranks=seen.ranks.get(i, {}), state=cancel.states.get(i) if own is None else None))
        # the harness's own cancel leaves the same banner in the nodes' logs: only one it did not send counts
        stopped = None if cancel.sent or code == 0 else slurm_stopped(out_dir, launcher.nnodes, alloc.job_id)
        write_nodes(out_dir, NodesLaunch("slurm", launcher.nproc, endpoint, out_dir.name, launcher.rdzv.join_timeout_s,
                                         nodes, alloc.job_id, step.id, stopped))
        return dataclasses.replace(result, slurm_job_id=alloc.job_id)
    finally:
        if alloc.owned:
            _query(["scancel", alloc.job_id])  # release it: nothing of the point runs in it any more


def _srun(alloc: Allocation, name: str, launcher: Launcher) -> list[str]:
    """srun of one task per node in the allocation, named with the run's token. One CPU per
    worker unless the runbook's srun_args say otherwise."""
    cpus = [] if any(a.startswith("--cpus-per-task") for a in launcher.srun_args) else [
        f"--cpus-per-task={launcher.nproc}"]
    return ["srun", f"--jobid={alloc.job_id}", f"--job-name={name}", f"--nodes={launcher.nnodes}",
            f"--ntasks={launcher.nnodes}", "--ntasks-per-node=1", *cpus, *launcher.srun_args]


def _allocation(launcher: Launcher, name: str, env: Mapping[str, str], cwd: Path, timeout_s: float,
                out_dir: Path) -> Allocation:
    """The allocation the harness runs in, else a new one (salloc --no-shell, named ``name``),
    waited for up to ``timeout_s``; an interrupt or timeout cancels the request."""
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        return Allocation(job, owned=False)
    cpus = [] if any(a.startswith("--cpus-per-task") for a in launcher.srun_args) else [
        f"--cpus-per-task={launcher.nproc}"]
    argv = ["salloc", "--no-shell", f"--job-name={name}", f"--nodes={launcher.nnodes}", "--ntasks-per-node=1", *cpus,
            *launcher.srun_args]
    failed = f"salloc {' '.join(argv[1:])} failed"
    try:
        got = runner.run(argv, env=env, cwd=cwd, timeout_s=timeout_s, log_dir=out_dir, log_name="salloc",
                         on_poll=_Pending(name, failed))
    except (KeyboardInterrupt, HarnessError):
        _query(["scancel", f"--name={name}"])
        raise
    job = _job_id(name)
    if got.exit_code != 0 or not job:
        _query(["scancel", f"--name={name}"])
        why = "no allocation in the phase's timeout" if got.exit_code is None else got.stderr_tail(3).strip()
        raise HarnessError(f"{failed}: {why} (salloc.stderr.log)")
    return Allocation(job, owned=True)


#: reasons Slurm gives a pending job that no wait resolves: the request is beyond what the
#: partition holds or allows (Slurm queues such a job unless EnforcePartLimits rejects it)
NEVER_GRANTED = ("PartitionNodeLimit", "PartitionConfig", "PartitionTimeLimit", "BadConstraints")


class _Pending:
    """salloc's wait watched (a poll callback: at most every PENDING_LOOK_S): a request Slurm holds
    for a reason no wait resolves is a HarnessError at once, not at the phase's timeout."""

    def __init__(self, name: str, failed: str):
        self.name, self.failed = name, failed
        self._last = 0.0

    def __call__(self, elapsed: float) -> None:
        if time.monotonic() - self._last < PENDING_LOOK_S:
            return
        self._last = time.monotonic()
        reason = _query(["squeue", "--noheader", "--states=PENDING", f"--name={self.name}", "--format=%r"]).strip()
        if reason in NEVER_GRANTED:
            raise HarnessError(f"{self.failed}: Slurm holds the request pending ({reason}), and no wait grants it: the "
                               "partition has fewer nodes than launcher.nodes (or they are down), or srun_args ask "
                               "for more than it allows (salloc.stderr.log)")


#: the shared-directory step's command on each node: its short host name, then, given the rendezvous
#: host ($1), getent's exit status for that name there (2: the name is not known there)
_SHARED_CHECK = 'hostname --short && if [ -n "$1" ]; then getent hosts "$1" > /dev/null; echo "getent $?"; fi'
_UNRESOLVED = "getent 2"


def _shared_hosts(alloc: Allocation, nnodes: int, name: str, env: Mapping[str, str], cwd: Path,
                  out_dir: Path, rdzv_host: str | None) -> list[str]:
    """Each node's host, by task, from a step that writes ``hostname`` into the run directory
    through ``srun --output``: a node whose file does not appear here does not see the run
    directory, and its ranks could not leave their files where the harness reads them. The same step
    looks up ``rdzv_host`` on every node (``getent hosts``): a node that cannot resolve it is named at
    once, where its torchrun agent would wait out the join timeout saying nothing of why."""
    check = out_dir / "slurm_shared_check"
    check.mkdir()
    argv = ["srun", f"--jobid={alloc.job_id}", f"--job-name={name}", f"--nodes={nnodes}", f"--ntasks={nnodes}",
            "--ntasks-per-node=1", f"--output={check}/node%t.txt", "sh", "-c", _SHARED_CHECK, "sh", rdzv_host or ""]
    got = runner.run(argv, env=env, cwd=cwd, timeout_s=SHARED_CHECK_S, log_dir=check, log_name="srun")
    said = [(check / f"node{i}.txt").read_text().splitlines() if (check / f"node{i}.txt").is_file() else []
            for i in range(nnodes)]
    hosts = [lines[0].strip() if lines else "" for lines in said]
    missing = [i for i, h in enumerate(hosts) if not h]
    if got.exit_code != 0 or missing:
        raise HarnessError(f"the run directory {out_dir} is not on a filesystem every node of job {alloc.job_id} sees "
                           f"(srun --output of `hostname` left nothing here from node(s) "
                           f"{', '.join(map(str, missing)) or '?'}; srun exit {got.exit_code}: "
                           f"{got.stderr_tail(2).strip()}): put --results-dir on a shared filesystem")
    unresolved = [f"node {i} ({hosts[i]})" for i, lines in enumerate(said) if _UNRESOLVED in lines]
    if unresolved:
        raise HarnessError(f"the rendezvous host {rdzv_host!r} (the first node of job {alloc.job_id}) does not resolve "
                           f"on {', '.join(unresolved)}: `getent hosts {rdzv_host}` found nothing there, so a "
                           "torchrun agent there would wait out the rendezvous's join timeout: give each such node a "
                           "name for it (DNS, /etc/hosts)")
    shutil.rmtree(check)
    return hosts


def rendezvous_host(job_id: str) -> str | None:
    """The host of the rendezvous's store: the allocation's first node (task 0 runs there: one task
    per node, in block order) by the name Slurm gives it (squeue's node list through ``scontrol show
    hostnames``); None where Slurm lists none, and the run then takes it as task 0's ``hostname
    --short`` said (the shared-directory step).

    Its name, not its address (``NodeAddr`` of ``scontrol show node``), though on a cluster whose
    node names do not resolve on the compute network the address would reach it: torchrun's c10d
    backend has the agent whose machine the endpoint names host the store (torch 2.13's
    ``_matches_machine_hostname``), and it takes a name equal to the machine's ``gethostname()`` as
    itself outright (Slurm's node name is the host's short name unless slurmd runs with ``-N``), an
    address only where that host name resolves to it there. Many hosts resolve their own name to a
    loopback address (Debian's and Ubuntu's /etc/hosts: 127.0.1.1), and torch does not then take the
    host's own network address as itself, so an address endpoint would leave
    no agent hosting the store, and every node would wait out the join timeout where names work
    today. Only the first node may be told it hosts (``--rdzv-conf is_host=1``), which takes a
    command line of its own, and one srun of torchrun gives every task the same one. A node on which
    the name does not resolve is named before the trainer starts (``_shared_hosts``)."""
    nodelist = _query(["squeue", "--noheader", f"--jobs={job_id}", "--format=%N"]).strip()
    names = _query(["scontrol", "show", "hostnames", nodelist]).split() if nodelist else []
    return names[0] if names else None


class _StepSeen:
    """The trainer's step (``job.step``), looked up while it runs (a tree observer: at most every
    STEP_LOOK_S until found); a step that has ended is no longer listed."""

    def __init__(self, job_id: str, name: str):
        self.job_id, self.name = job_id, name
        self.id: str | None = None
        self._last = 0.0

    def __call__(self, tree: ProcessTree) -> None:
        if self.id is None and time.monotonic() - self._last >= STEP_LOOK_S:
            self._last = time.monotonic()
            self.id = _step_id(self.job_id, self.name)


class _Cancel:
    """The point's step cancelled (runner.Cancel): SIGTERM to its tasks, torchrun's agents, which
    stop their workers; SIGKILL through Slurm after KillWait and a margin. A step must be sent
    SIGTERM by name (``scancel --signal=TERM``): a plain ``scancel`` of a step SIGKILLs it at once
    (measured here, unlike a plain scancel of a job, which waits KillWait). With no step found,
    the harness's own job is cancelled (SIGTERM, then Slurm's SIGKILL after KillWait)."""

    def __init__(self, alloc: Allocation, step: _StepSeen, seen: RankSeen, kill_wait: float):
        self.alloc, self.step, self.seen, self.kill_wait = alloc, step, seen, kill_wait
        self.sent = False
        """Whether the harness cancelled the step (or its job)."""
        self.states: dict[int, str] = {}
        """Node -> the process state of its agent on this host as the harness stopped the run
        ('stopped' tells a frozen agent from one that waits)."""

    def __call__(self, done: Callable[[], bool]) -> None:
        self.states = self.seen.agent_states()
        step = self.step.id or _step_id(self.alloc.job_id, self.step.name)
        target = step or (self.alloc.job_id if self.alloc.owned else None)
        if target is None or done():
            return  # nothing of the point runs in Slurm: the local kill ends srun
        self.sent = True
        _query(["scancel", "--signal=TERM", target] if step else ["scancel", target])
        if not _wait(done, self.kill_wait + KILL_MARGIN_S):
            _query(["scancel", "--signal=KILL", target])
            _wait(done, KILL_MARGIN_S)


class _RendezvousClosed:
    """The launch-over test of srun's one process (runner.LaunchOver): a task, a node's torchrun
    agent, failed (srun says so on its stderr as the task ends, while it waits for the others)
    after giving up on a rendezvous that no rank can start from any more (its log, in the shared
    run directory: RendezvousTimeoutError or RendezvousClosedError). A failed task whose log says
    anything else is a rank's failure, which torchrun's own end of the others settles."""

    def __init__(self, srun_stderr: Path, out_dir: Path):
        self.srun_stderr, self.out_dir = srun_stderr, out_dir
        self.task: int | None = None
        """The task that gave up on the closed rendezvous."""
        self.exit_code: int | None = None
        """Its exit code, as srun reported it: the launch ends as that task did."""
        self.said: str | None = None
        self.since: float | None = None

    def look(self, tree: ProcessTree, now: float) -> float | None:
        if self.task is None:
            for task, code in sorted(task_ends(self.srun_stderr).items()):
                said = agent_said(self.out_dir / f"node{task}.stderr.log")
                if code != 0 and closed_rendezvous(said):
                    self.task, self.exit_code, self.said, self.since = task, code, said, now
                    break
        return None if self.since is None else now - self.since

    def note(self, over_s: float) -> str:
        return (f"node {self.task}'s agent (srun's task {self.task}) gave up on the rendezvous ({gave_up(self.said)}), "
                f"which no rank can start from any more, and srun still waited for the other tasks {over_s:.0f}s later")


def _agent_exit(node: int, ends: Mapping[int, int], code: int | None, cancel: _Cancel) -> int | None:
    """A node's agent's own exit code: srun's word on its task, 0 for one srun said nothing of in
    a launch that ended 0; None where it is not known, or where the harness's cancel ended it still
    running (what srun reports then is the cancel's doing, as a kill on this host would be)."""
    if cancel.sent and node in cancel.states:
        return None
    return ends.get(node, 0 if code == 0 else None)


def slurm_stopped(out_dir: Path, nnodes: int, job_id: str) -> str | None:
    """How Slurm ended the step, where it did: slurmstepd's banner in the first node log that
    has one ('*** STEP 14.1 ON vm CANCELLED AT 2026-11-27T14:04:13 ***', '... DUE TO TIME LIMIT
    ***'), with the job's state where it has ended (``_job_end``); None when no node's log has one."""
    for i in range(nnodes):
        try:
            text = (out_dir / node_log(i, "stderr")).read_text(errors="replace")
        except OSError:
            continue
        banner = _STEPD_BANNER.search(text)
        if banner is not None:
            return f"node {i}: {banner.group(0)}{_job_end(job_id)}"
    return None


def _job_end(job_id: str) -> str:
    """'; job 14 CANCELLED': the state the job ended in (JOB_ENDED), waited for up to JOB_END_WAIT_S
    while Slurm is still ending it (JOB_ENDING, which hides that state), else that it was still
    ending; '' for a job that did not end (a step cancelled alone leaves its job RUNNING)."""
    deadline = time.monotonic() + JOB_END_WAIT_S
    state = _job_state(job_id)
    while state == JOB_ENDING and time.monotonic() < deadline:
        time.sleep(JOB_END_LOOK_S)
        state = _job_state(job_id)
    if state == JOB_ENDING:
        return (f"; job {job_id} still ending ({JOB_ENDING} {JOB_END_WAIT_S:g} s after its step ended): the state it "
                "ended in is not final yet")
    return f"; job {job_id} {state}" if state in JOB_ENDED else ""


def _job_state(job_id: str) -> str:
    """The job's state as squeue shows it ('' where squeue does not answer)."""
    return _query(["squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T"]).strip()


def _wait(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _job_id(name: str) -> str:
    """The id of the job named ``name`` (squeue --name; --states=all keeps finding an ended one
    for MinJobAge)."""
    out = _query(["squeue", "--noheader", "--states=all", f"--name={name}", "--format=%i"]).split()
    return out[0] if out else ""


def _step_id(job_id: str, name: str) -> str | None:
    """``job.step`` of the running step named ``name`` in the job, None when there is none."""
    for line in _query(["squeue", "--noheader", "--steps", f"--jobs={job_id}", "--format=%i %j"]).splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1] == name:
            return fields[0]
    return None


_KILL_WAIT: list[float] = []


def kill_wait_s() -> float:
    """Slurm's KillWait (scontrol show config), 30 s (its default) when it cannot be read."""
    if not _KILL_WAIT:
        m = re.search(r"^KillWait\s*=\s*(\d+)", _query(["scontrol", "show", "config"]), re.M)
        _KILL_WAIT.append(float(m.group(1)) if m else 30.0)
    return _KILL_WAIT[0]


def task_ends(srun_stderr: Path) -> dict[int, int]:
    """Task -> exit code (negative: the signal) from srun's ``srun: error: HOST: task(s) N: ...``
    lines; a task srun says nothing of ended with 0 when srun did."""
    out: dict[int, int] = {}
    try:
        lines = srun_stderr.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = _TASK_END.match(line.strip())
        if m is None:
            continue
        code = re.match(r"Exited with exit code (\d+)", m["what"])
        value = int(code.group(1)) if code else _SIGNALS.get(m["what"].strip())
        if value is None:
            continue
        for part in m["tasks"].split(","):
            lo, _, hi = part.partition("-")
            for task in range(int(lo), int(hi or lo) + 1):
                out[task] = value
    return out


def _query(argv: list[str]) -> str:
    """A Slurm command's stdout ('' when it fails or does not answer in QUERY_TIMEOUT_S)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""
