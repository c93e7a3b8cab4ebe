"""A node whose torchrun agent is frozen before the rendezvous (its process SIGSTOPped, as a
frozen host's would be): it lives, says nothing and never joins. The other node's agent gives up
at the join timeout and, exiting, closes the rendezvous for good (torchrun's launch_agent shuts
its rendezvous down on any error but a signal), so no rank can start any more. The harness once
held such a point until the start-up allowance, then recorded a stall with no stack, 'no rank
was left running', and advice about torchrun's exit barrier and 'read its log ... host down' for
a node whose log is empty. The frozen node must be named, with its process state, within the
launch-over grace after the other gave up.

Test trainer outside the nsa package: tests/trainers/native_train.py (it never starts here).
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.faults import _util as U
from tests.faults import fake_slurm
from validation.judge.findings import Severity, find, recommendations
from validation.judge.record import Status
from validation.launch import nodes as local_nodes
from validation.launch.process import LAUNCH_OVER_GRACE_S, Command

pytestmark = [pytest.mark.faults, pytest.mark.distributed, pytest.mark.multi_node]

JOIN_S = 6
#: the start-up allowance: long, so that a record at its end would show
STARTUP_S = 60.0
NATIVE = {"name": "native", "root": "tests/trainers", "script": "native_train.py",
          "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}


def _frozen(command: Command) -> Command:
    """The agent's command, its process stopped (SIGSTOP) before it runs torchrun, i.e. before it
    reaches the rendezvous; nothing continues it."""
    freeze = ("import os, signal, sys; os.kill(os.getpid(), signal.SIGSTOP); "
              "os.execv(sys.executable, [sys.executable] + sys.argv[1:])")
    return Command([sys.executable, "-c", freeze, *command.argv[1:]], command.log_name, command.env)


def _run_frozen(tmp_path: Path, runbook: str, launcher: dict):
    """The point of two nodes whose node 1 is frozen (the caller freezes it), run through the
    session in this process, and nothing of it left running."""
    phase = {"name": "frozen_node", "kind": "train", "steps": 8, "timeout_s": 120, "stall_s": 16,
             "startup_s": STARTUP_S, "env": {"OMP_NUM_THREADS": 1}, "launcher": launcher,
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    return U.run_one_point(tmp_path, runbook, NATIVE, phase)


def test_a_node_whose_agent_is_frozen_before_the_rendezvous_is_named_once_the_other_gave_up(
        tmp_path, matrix, monkeypatch):
    matrix.start("node frozen before the rendezvous",
                 f"node 1's torchrun agent SIGSTOPped before it runs, two agents x1 (c10d on localhost, join timeout "
                 f"{JOIN_S} s), `startup_s` {STARTUP_S:g} s",
                 "FAIL 'trainer ended before its first step (exit code 1)' within the grace after node 0's agent gave "
                 "up (RendezvousTimeoutError), not at startup_s; node 1 named as never having joined, its agent still "
                 "running in process state 'stopped' with an empty log; no stall finding, no 'host down' advice")
    monkeypatch.delenv("TEST_TRAINER_FAULT", raising=False)
    real = local_nodes.agent_commands
    monkeypatch.setattr(local_nodes, "agent_commands",
                        lambda argv, devices: [c if i == 0 else _frozen(c) for i, c in enumerate(real(argv, devices))])
    t0 = time.time()
    rec = _run_frozen(tmp_path, "frozen_node", {"kind": "torchrun", "nproc": 1, "nnodes": 2,
                                                "rdzv": {"endpoint": "localhost:0", "join_timeout_s": JOIN_S}})
    assert rec.status == Status.FAIL and rec.stalled_s is None and not rec.timed_out, rec.reason
    assert rec.reason == "trainer ended before its first step (exit code 1)", rec.reason
    node0, node1 = rec.evidence.nodes.nodes
    assert node0.exit_code == 1 and "RendezvousTimeoutError" in (node0.said or ""), node0
    assert node1.exit_code is None and node1.state == "stopped" and node1.said is None, node1
    after = rec.wall_s - node0.ended_s  # from node 0's give-up to the record
    bound = LAUNCH_OVER_GRACE_S + 5.0
    assert after <= bound and rec.wall_s < STARTUP_S, (after, rec.wall_s)
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["node_stuck"], [f.title for f in found]
    [f] = [f for f in found if f.kind == "node_stuck"]
    text = f.title + "\n" + "\n".join(f.detail)
    assert f.title.startswith("node 1 never joined the rendezvous in frozen_node [default]: no rank started; the "
                              f"others gave up waiting (join timeout {JOIN_S} s): node 0 after"), text
    assert f.title.endswith("RendezvousTimeoutError; node 1's agent was still running (process state stopped) and "
                            "had written nothing in its log when the harness stopped it"), text
    assert "node 1 never joined: its agent still running (process state stopped) when the harness stopped the run; " \
           "log node1.stderr.log (empty)" in f.detail, text
    [advice] = recommendations(found)
    assert "'stopped' is a SIGSTOP" in advice and "host down" not in advice and "exit barrier" not in advice, advice
    said = (tmp_path / "results" / rec.out_dir / "node1.stderr.log").read_text()
    assert "gave up on the rendezvous (RendezvousTimeoutError), which no rank can start from any more" in said, said
    matrix.done(rec.status, rec.reason + " | " + f.title, after, bound)
    print(f"\nfrozen node: node 0 gave up {node0.ended_s:.1f} s after the launch, recorded {rec.wall_s:.1f} s after "
          f"it ({time.time() - t0:.1f} s with the harness); {f.title}")


def _killed_at(command: Command, step: int) -> Command:
    """The agent's command, its own process SIGKILLed (as kill -9 of it, or the OOM killer, would)
    once its rank's heartbeats reach ``step``: a watcher forked before torchrun starts does it,
    the agent's workers, in sessions of their own, living on."""
    kill = ("import os, signal, sys, time\n"
            "out = sys.argv[sys.argv.index('--out-dir') + 1]\n"
            "agent = os.getpid()\n"
            "if os.fork() == 0:\n"
            "    beat = os.path.join(out, 'heartbeat_rank1.jsonl')\n"
            f"    while not (os.path.exists(beat) and '\"step\": {step},' in open(beat).read()):\n"
            "        time.sleep(0.05)\n"
            "    os.kill(agent, signal.SIGKILL)\n"
            "    os._exit(0)\n"
            "os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n")
    return Command([sys.executable, "-c", kill, *command.argv[1:]], command.log_name, command.env)


def test_a_node_whose_agent_is_killed_while_its_rank_trains_on_is_named_not_a_crash(tmp_path, matrix, monkeypatch):
    """kill -9 of node 1's torchrun agent mid-run: its rank, in a session of its own, trains on;
    whichever way the run then ends (the ranks finish and node 0's agent waits on a store gone with
    node 1's, or a rank loses its peer), no rank failed in its own right. The verdict said 'trainer
    crashed (exit code -9)' beside a crash finding advising to read a traceback no rank wrote."""
    matrix.start("node whose torchrun agent is SIGKILLed",
                 "node 1's torchrun agent SIGKILLed once its rank reached step 3 of 60, two agents x1 (c10d on "
                 "localhost); its rank lives on",
                 "FAIL 'node 1's torchrun agent was killed by SIGKILL (exit code -9)'; the one critical finding the "
                 "killed agent's, with its own advice; no crash finding")
    monkeypatch.delenv("TEST_TRAINER_FAULT", raising=False)
    real = local_nodes.agent_commands
    monkeypatch.setattr(local_nodes, "agent_commands",
                        lambda argv, devices: [c if i == 0 else _killed_at(c, 3) for i, c in enumerate(real(argv, devices))])
    phase = {"name": "agent_killed", "kind": "train", "steps": 60, "timeout_s": 120, "stall_s": 20,
             "env": {"OMP_NUM_THREADS": 1}, "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}],
             "launcher": {"kind": "torchrun", "nproc": 1, "nnodes": 2,
                          "rdzv": {"endpoint": "localhost:0", "join_timeout_s": JOIN_S}}}
    rec = U.run_one_point(tmp_path, "agent_killed", NATIVE, phase)
    node1 = rec.evidence.nodes.nodes[1]
    assert node1.exit_code == -9, rec.evidence.nodes
    assert rec.status == Status.FAIL and rec.reason.startswith("node 1's torchrun agent was killed by SIGKILL (exit "
                                                               "code "), rec.reason
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["agent_killed"], [f.title for f in found]
    [f] = [f for f in found if f.kind == "agent_killed"]
    assert f.title.startswith("node 1's torchrun agent was killed by SIGKILL in agent_killed [default]"), f.title
    [advice] = recommendations([f])
    assert "torchrun agent itself was killed" in advice, advice
    matrix.done(rec.status, rec.reason + " | " + f.title, rec.wall_s, phase["timeout_s"])


def test_a_slurm_node_frozen_before_the_rendezvous_is_named_once_the_other_gave_up(tmp_path, matrix, monkeypatch):
    """The same frozen node under the Slurm launcher (srun of torchrun, one task per node; Slurm's
    commands are tests/faults/fake_slurm.py's, every node this host). srun waits for every task:
    node 0's agent gave up at the join timeout and exited 1 (srun said so on its stderr at once,
    and the agent's traceback went to node0.stderr.log in the run directory), but node 1's task
    kept srun, the harness's one launched process, running: the point was held until startup_s,
    then recorded as a stall with no stack, where the plain multi-node launcher ends within the
    grace."""
    matrix.start("node frozen before the rendezvous, Slurm",
                 f"node 1's task (its torchrun agent) SIGSTOPped before it runs, srun of torchrun on 2 nodes x1 "
                 f"(a stand-in Slurm, every node this host; join timeout {JOIN_S} s), `startup_s` {STARTUP_S:g} s",
                 "FAIL 'trainer ended before its first step (exit code 1)' within the grace after node 0's agent gave "
                 "up (RendezvousTimeoutError, as srun reported its task's end), not at startup_s; node 1 named as never "
                 "having joined, its agent (seen on this host) in process state 'stopped'; no stall finding")
    monkeypatch.delenv("TEST_TRAINER_FAULT", raising=False)
    bin_dir = fake_slurm.install(tmp_path / "slurm_bin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "2")
    monkeypatch.setenv(fake_slurm.FREEZE_ENV, "1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.time()
    rec = _run_frozen(tmp_path, "frozen_slurm", {"kind": "slurm", "nodes": 2, "nproc_per_node": 1,
                                                 "rdzv": {"port": port, "join_timeout_s": JOIN_S}})
    assert rec.status == Status.FAIL and rec.stalled_s is None and not rec.timed_out, rec.reason
    assert rec.reason == "trainer ended before its first step (exit code 1)", rec.reason
    assert rec.evidence.nodes.launcher == "slurm" and rec.slurm_job_id == "4242", rec.evidence.nodes
    node0, node1 = rec.evidence.nodes.nodes
    assert node0.exit_code == 1 and "RendezvousTimeoutError" in (node0.said or ""), node0
    # node 1's agent runs on this host: the harness saw it (by the run's token) and its state as it stopped the run
    assert node1.exit_code is None and node1.said is None and node1.state == "stopped", node1
    # node 0's agent gives up at the join timeout from its own start (after the harness's check step
    # and torchrun's imports: a few seconds on 2 busy cores), then the launch-over grace
    bound = JOIN_S + LAUNCH_OVER_GRACE_S + 15.0
    assert rec.wall_s < bound < STARTUP_S, (rec.wall_s, bound)
    found = find([rec])
    assert [f.kind for f in found if f.severity == Severity.CRITICAL] == ["node_stuck"], [f.title for f in found]
    [f] = [f for f in found if f.kind == "node_stuck"]
    assert f.title == ("node 1 never joined the rendezvous in frozen_node [default]: no rank started; the others gave up "
                       f"waiting (join timeout {JOIN_S} s): node 0, RendezvousTimeoutError; node 1's agent was still "
                       "running (process state stopped) and had written nothing in its log when the harness stopped "
                       "it"), f.title
    # srun says nothing of a task that has not failed; its agent's process, here, was seen stopped
    assert ("node 1 never joined: its agent still running (process state stopped) when the harness stopped the run; "
            "log node1.stderr.log (empty)") in f.detail, f.detail
    said = (tmp_path / "results" / rec.out_dir / "srun.stderr.log").read_text()
    assert ("node 0's agent (srun's task 0) gave up on the rendezvous (RendezvousTimeoutError), which no rank can "
            "start from any more") in said, said
    matrix.done(rec.status, rec.reason + " | " + f.title, rec.wall_s, bound)
    print(f"\nfrozen node under Slurm: recorded {rec.wall_s:.1f} s after the launch ({time.time() - t0:.1f} s with "
          f"the harness); {f.title}")
