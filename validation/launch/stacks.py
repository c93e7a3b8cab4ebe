"""The harness takes every rank's Python stack itself before it kills a stalled or timed-out run.

``py-spy dump --pid`` reads any Python process's stack from outside, with no cooperation from the
trainer. Where it cannot (not installed; ptrace not permitted, as in a container without
CAP_SYS_PTRACE) the process gets SIGUSR1 instead, if it handles that signal: this project's
trainer, and others using ``faulthandler.register``, then write their own dump. Either way the
run directory's ``harness_stacks/index.json`` says what was done for which process
(validation/contract/stacks.py).

Which process is which rank: the ``RANK`` in its environment (torchrun sets it for each worker);
else the process whose ``pid`` a rank's heartbeats carry (the contract's field for this: a trainer
that runs its training in a child of the process launched, a supervisor restarting it, is known by
it); else, for the python launcher, the launched process itself is rank 0. A Python process below a
rank (a data loader or compile worker) is that rank's helper, not a rank of its own: up to
``HELPERS_PER_RANK`` of each rank's are dumped as its helpers (a rank that waits for its data loader
shows only the wait; the worker's stack shows where the data is stuck). torchrun's agents (the
launched processes, or a ``torch.distributed.run`` that srun started) are launchers, not ranks. Any
other Python process is "rank unknown": dumped, never given a guessed rank. A rank's node is the
launch's node index in its environment (validation/contract/nodes.py: the harness's own variable,
or Slurm's task id).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import psutil

from validation.contract.stacks import HARNESS_STACKS, HELPERS_PER_RANK, TakenStack, write_index
from validation.contract.nodes import node_of

#: seconds all py-spy dumps together may take (they run side by side)
PYSPY_TIMEOUT_S = 10.0
#: seconds between SIGUSR1 (the trainer's own dump) and the kill
SIGUSR1_GRACE_S = 3.0


@dataclass(frozen=True)
class RankedProcess:
    proc: psutil.Process
    rank: int | None
    """None: rank unknown."""
    rank_from: str
    """'RANK', 'heartbeat pid', 'single process', or '' when unknown (TakenStack.rank_from)."""
    node: int | None = None
    """The launch's node index it ran on (several nodes); None for one node or unknown."""
    helper_of: int | None = None
    """Of a rank's helper (a Python process below it, ``rank`` None): that rank; None otherwise."""


def pyspy_executable() -> str | None:
    """py-spy beside this interpreter (a virtual environment's bin/, which need not be on PATH),
    else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def ranked(members: list[psutil.Process], roots: Sequence[psutil.Process], single_process: bool,
           beat_pids: dict[int, int] | None = None) -> list[RankedProcess]:
    """The processes whose stacks tell where each rank is: each rank's own process, and any other
    Python process as rank unknown (see the module's docstring). ``beat_pids``: pid -> rank, as the
    ranks' heartbeats say (the last record of each rank's file)."""
    by_pid = {p.pid: p for p in members}
    launched = {r.pid for r in roots}
    named = {pid: rank for pid, rank in (beat_pids or {}).items() if pid in by_pid}
    own: dict[int, tuple[int | None, str] | None] = {}
    for p in members:
        env = _environ(p)
        rank = env.get("RANK", "")
        if rank.isdigit():
            own[p.pid] = (int(rank), "RANK")
        elif p.pid in named:
            own[p.pid] = (named[p.pid], "heartbeat pid")
        elif single_process and p.pid in launched and 0 not in named.values():
            own[p.pid] = (0, "single process")
        elif p.pid in launched or is_agent(p):
            own[p.pid] = None  # torchrun's agent (or srun): a launcher, not a rank
        elif _is_python(p):
            own[p.pid] = (None, "")
    out, helpers = [], {}
    for pid, what in sorted(own.items()):
        if what is None:
            continue
        node = node_of(_environ(by_pid[pid]))
        above = _rank_above(by_pid[pid], by_pid, own)
        if above is None:
            out.append(RankedProcess(by_pid[pid], *what, node=node))
        elif _is_python(by_pid[pid]) and len(helpers.setdefault(above, [])) < HELPERS_PER_RANK:
            helpers[above].append(RankedProcess(by_pid[pid], None, "", node=node, helper_of=above))
    return sorted(out, key=lambda r: (r.rank is None, r.rank or 0, r.proc.pid)) + [
        h for rank in sorted(helpers) for h in helpers[rank]]


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return {}


def is_agent(p: psutil.Process) -> bool:
    """torchrun's agent that another launcher (srun) started: ``python -m torch.distributed.run``."""
    try:
        return "torch.distributed.run" in p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _is_python(p: psutil.Process) -> bool:
    try:
        exe = p.exe() or (p.cmdline() or [""])[0]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return os.path.basename(exe).startswith("python")


def _rank_above(p: psutil.Process, by_pid: dict[int, psutil.Process],
                own: dict[int, tuple[int | None, str] | None]) -> int | None:
    """The rank of the nearest ancestor of ``p`` in the tree that is a rank (``p`` is its helper); None
    where none is."""
    seen = set()
    try:
        parent = p.ppid()
        while parent in by_pid and parent not in seen:
            seen.add(parent)
            what = own.get(parent)
            if what is not None and what[0] is not None:
                return what[0]
            parent = by_pid[parent].ppid()
    except psutil.NoSuchProcess:
        pass
    return None


def take(processes: list[RankedProcess], run_dir: Path, after: str, pyspy: str | None = None) -> list[TakenStack]:
    """Each process's stack into ``run_dir/harness_stacks/`` (py-spy, else SIGUSR1), and the
    index of what was done. ``after`` says why (it heads each dump). ``pyspy``: the executable
    (default: pyspy_executable())."""
    pyspy = pyspy or pyspy_executable()
    folder = run_dir / HARNESS_STACKS
    folder.mkdir(parents=True, exist_ok=True)
    states = {r.proc.pid: _state(r.proc) for r in processes}  # before py-spy's attach halts them a moment
    dumps = _pyspy_all(pyspy, [r.proc.pid for r in processes])
    taken, signalled = [], False
    for r in processes:
        text, error = dumps[r.proc.pid]
        state = states[r.proc.pid]
        name = (f"rank{r.rank}.txt" if r.rank is not None else f"pid{r.proc.pid}.txt" if r.helper_of is None
                else f"rank{r.helper_of}_helper{r.proc.pid}.txt")
        who = (f"rank {r.rank} ({r.rank_from})" if r.rank is not None else "rank unknown" if r.helper_of is None
               else f"rank {r.helper_of}'s helper (a process below it: a data loader or compile worker)")
        if r.node is not None:
            who += f", node {r.node}"
        if text is not None:
            header = f"=== py-spy dump of pid {r.proc.pid}, {who}, taken by the harness: {after} ===\n"
            (folder / name).write_text(header + text)
            taken.append(TakenStack(r.proc.pid, r.rank, r.rank_from, "py-spy", f"{HARNESS_STACKS}/{name}", node=r.node,
                                    state=state, helper_of=r.helper_of))
            continue
        note = f"py-spy could not take its stack ({error})"
        if r.helper_of is not None:  # a forked helper inherits its rank's SIGUSR1 handler, and its dump file
            taken.append(TakenStack(r.proc.pid, None, "", "none", node=r.node, state=state, note=note,
                                    helper_of=r.helper_of))
            continue
        if state == psutil.STATUS_STOPPED:
            taken.append(TakenStack(r.proc.pid, r.rank, r.rank_from, "none", node=r.node, state=state,
                                    note=note + "; its process is stopped (SIGSTOP, or a debugger): it runs no handler "
                                                "of its own to write one"))
        elif _handles(r.proc.pid, signal.SIGUSR1) and _signal(r.proc, signal.SIGUSR1):
            signalled = True
            taken.append(TakenStack(r.proc.pid, r.rank, r.rank_from, "SIGUSR1", node=r.node, state=state,
                                    note=note + "; SIGUSR1 sent instead: the trainer's own handler writes the dump"))
        else:
            taken.append(TakenStack(r.proc.pid, r.rank, r.rank_from, "none", node=r.node, state=state,
                                    note=note + "; it has no SIGUSR1 handler to ask instead"))
    if signalled:
        time.sleep(SIGUSR1_GRACE_S)  # the handlers write their dumps before the kill
    write_index(run_dir, taken)
    return taken


def _pyspy_all(pyspy: str | None, pids: list[int]) -> dict[int, tuple[str | None, str]]:
    """pid -> (py-spy's dump or None, why not), all dumps taken side by side."""
    if pyspy is None:
        return {pid: (None, "py-spy is not installed") for pid in pids}
    procs = {}
    for pid in pids:
        try:
            procs[pid] = subprocess.Popen([pyspy, "dump", "--pid", str(pid), "--full-filenames"],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, errors="replace")
        except OSError as exc:
            procs[pid] = exc
    deadline = time.monotonic() + PYSPY_TIMEOUT_S
    out: dict[int, tuple[str | None, str]] = {}
    for pid, proc in procs.items():
        if isinstance(proc, OSError):
            out[pid] = (None, f"cannot run {pyspy}: {proc}")
            continue
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            out[pid] = (None, f"no answer in {PYSPY_TIMEOUT_S:g}s")
            continue
        if proc.returncode == 0 and stdout.strip():
            out[pid] = (stdout, "")
        else:
            lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
            why = next((ln for ln in lines if ln.startswith("Error")), lines[0] if lines else "no output")
            out[pid] = (None, f"exit {proc.returncode}: {why}")
    return out


def _handles(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status; psutil does not
    expose signal dispositions). Without one, SIGUSR1 would kill it rather than ask for a dump."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _state(proc: psutil.Process) -> str:
    """psutil's state of the process ('' where it has ended)."""
    try:
        return proc.status()
    except psutil.Error:
        return ""


def _signal(proc: psutil.Process, sig: int) -> bool:
    try:
        proc.send_signal(sig)
        return True
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
