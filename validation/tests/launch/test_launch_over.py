"""A launch of several processes (one torchrun agent per node) is over once one of them failed and
nothing of it runs but the launched processes themselves: the harness stops the rest within
LAUNCH_OVER_GRACE_S and the run ends as the failed one did. Two nodes whose rank 1 exited 0 early
once waited out the whole stall_s (or crashed; a race): node 1's agent, its worker done, waited
at torchrun's exit barrier on a store it held, with no rank left under any agent.

Here each 'agent' is a python process that runs one 'worker' child and then fails (exit 1), or
waits as torchrun's agent does at its exit barrier."""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

from validation.launch import process as runner
from validation.launch.process import LAUNCH_OVER_GRACE_S, Command
from validation.launch.watch import Watch

#: how long the run would go on without the harness stopping it
FAR_S = 60.0


def _agent(worker_s: float, then: str) -> list[str]:
    """A process that runs a worker child for ``worker_s`` seconds, then does ``then``."""
    body = f"""
        import subprocess, sys, time
        subprocess.run([sys.executable, "-c", "import time; time.sleep({worker_s})"])
        {then}
    """
    return [sys.executable, "-c", textwrap.dedent(body)]


def _run(tmp_path: Path, commands: list[Command], stall_s: float = FAR_S, single_process: bool = False) -> runner.ProcResult:
    watch = Watch(tmp_path, tmp_path / "training.csv", stall_s, stall_s, tmp_path, single_process=single_process)
    return runner.run_group(commands, env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, timeout_s=FAR_S + 30,
                            log_dir=tmp_path, poll_s=0.1, watch=watch)


def test_a_failed_agent_beside_one_with_no_rank_left_ends_the_launch_as_a_failure(tmp_path):
    failed = Command(_agent(0.5, "sys.exit(1)"), "node0")
    waiting = Command(_agent(0.5, f"time.sleep({FAR_S * 2})"), "node1")  # at its exit barrier
    t0 = time.monotonic()
    result = _run(tmp_path, [failed, waiting])
    took = time.monotonic() - t0
    assert took <= 0.5 + LAUNCH_OVER_GRACE_S + 5.0, f"the launch ended {took:.1f}s after it started"
    assert result.exit_code == 1 and not result.timed_out and result.stalled_s is None and not result.stacks
    node0, node1 = result.parts
    assert (node0.exit_code, node1.exit_code) == (1, None) and result.stderr_path.name == "node0.stderr.log"
    assert "no rank was left running under the others" in (tmp_path / "node1.stderr.log").read_text()


def test_a_failed_agent_beside_a_rank_still_running_is_left_to_the_stall_watch(tmp_path):
    """Not over while a rank (a process below an agent) still runs: it may be hung, and its stack
    is the evidence the stall watch takes."""
    failed = Command(_agent(0.5, "sys.exit(1)"), "node0")
    running = Command(_agent(FAR_S * 2, ""), "node1")
    result = _run(tmp_path, [failed, running], stall_s=LAUNCH_OVER_GRACE_S + 3)
    assert result.stalled_s is not None and result.exit_code is None, result
    assert result.parts[1].exit_code is None and result.stacks  # the worker's stack was taken


def test_agents_that_never_started_a_rank_are_left_to_their_rendezvous(tmp_path):
    """Before any rank ran there is nothing to be over: an agent still meeting ends by itself at the
    join timeout, and what it says then names the node that never came (test_nodes_launch.py)."""
    down = Command([sys.executable, "-c", "import sys; sys.exit('cannot start')"], "node1")
    meeting = Command([sys.executable, "-c", f"import sys, time; time.sleep({LAUNCH_OVER_GRACE_S + 2}); "
                                             "sys.exit('RendezvousTimeoutError')"], "node0")
    result = _run(tmp_path, [meeting, down])
    assert [p.exit_code for p in result.parts] == [1, 1] and result.exit_code == 1, result.parts
    assert "RendezvousTimeoutError" in (tmp_path / "node0.stderr.log").read_text()


def test_a_launcher_whose_ranks_have_ended_is_given_time_to_end_as_they_did(tmp_path):
    """One launcher (a torchrun agent) whose worker has failed, slower than ``stall_s`` to see it and
    end (a loaded machine): the run ends as the launcher does, a crash, not a stall of ranks that
    had all ended. A rank that exited 0 inside the last step was once called 'stalled ... no rank
    was left running' in CI rather than the crash its peer's broken collective was."""
    slow = Command(_agent(0.3, "time.sleep(2.5); sys.exit(1)"), "node0")
    result = _run(tmp_path, [slow], stall_s=1.0)
    assert result.exit_code == 1 and result.stalled_s is None and not result.timed_out, result


def test_a_launcher_that_outlives_its_ranks_past_the_grace_is_stopped_as_stalled(tmp_path):
    lingering = Command(_agent(0.3, f"time.sleep({FAR_S * 2})"), "node0")
    t0 = time.monotonic()
    result = _run(tmp_path, [lingering], stall_s=1.0)
    took = time.monotonic() - t0
    assert result.stalled_s is not None and result.exit_code is None and not result.stacks, result
    assert result.stalled_s >= 1.0 + LAUNCH_OVER_GRACE_S, result.stalled_s  # stall_s, then the grace
    assert took <= 1.0 + LAUNCH_OVER_GRACE_S + 5.0, f"stopped {took:.1f}s after it started"


def test_a_python_launch_whose_own_child_ended_is_stalled_at_stall_s(tmp_path):
    """A python launch's process is rank 0 itself: a child of its that ended (a data-loader worker)
    leaves the rank running, and its hang is a stall at ``stall_s``, given no launcher's grace."""
    hung = Command(_agent(0.3, f"time.sleep({FAR_S * 2})"), "trainer")
    result = _run(tmp_path, [hung], stall_s=1.0, single_process=True)
    assert result.stalled_s is not None and result.stalled_s < LAUNCH_OVER_GRACE_S, result
