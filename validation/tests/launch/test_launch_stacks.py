"""Which process is which rank when the harness takes stacks (validation/launch/stacks.py), and
how the stacks reach the record and the stall finding: each rank by the RANK its environment
holds, the python launcher's process as rank 0, Python processes below a rank as its helpers (up to
HELPERS_PER_RANK), anything else "rank unknown", never a guessed rank."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from validation.contract.stacks import Frame, StackDump, TakenStack, parse_pyspy, read_index
from validation.judge.findings import find, recommendations
from validation.judge.record import Beat, Evidence, PhaseRecord, PointKey, Status
from validation.launch import stacks
from validation.launch.tree import ProcessTree

SLEEP = "import time; time.sleep(60)"


def _spawn(tree: ProcessTree, code: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], env=tree.environment({**os.environ, **(env or {})}))


@pytest.fixture
def tree():
    t = ProcessTree()
    yield t
    t.kill()


def _members(tree: ProcessTree, n: int) -> list[psutil.Process]:
    deadline = time.monotonic() + 20
    while len(found := tree.members()) < n:
        assert time.monotonic() < deadline, f"{len(found)} of {n} processes started"
        time.sleep(0.05)
    return found


def test_ranks_come_from_the_environment_and_a_process_below_a_rank_is_its_helper(tree):
    """torchrun's shape: an agent (no RANK), two workers with RANK, a helper below rank 0 that
    inherited its RANK, a Python process with no RANK (rank unknown) and a non-Python one."""
    agent = _spawn(tree, f"""
import os, subprocess, sys, time
env = {{k: v for k, v in os.environ.items() if k != "RANK"}}
subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); "
                  + {SLEEP!r}], env={{**env, "RANK": "0"}})
subprocess.Popen([sys.executable, "-c", {SLEEP!r}], env={{**env, "RANK": "1"}})
subprocess.Popen([sys.executable, "-c", {SLEEP!r}], env=env)
subprocess.Popen(["sleep", "60"], env=env)
time.sleep(60)
""")
    tree.adopt(agent.pid)
    members = _members(tree, 6)
    found = stacks.ranked(members, tree.roots, single_process=False)
    ranks = [(r.rank, r.rank_from, r.helper_of) for r in found]
    assert ranks == [(0, "RANK", None), (1, "RANK", None), (None, "", None), (None, "", 0)], ranks
    by_rank = {r.rank: r.proc for r in found if r.helper_of is None}
    assert by_rank[0].environ()["RANK"] == "0" and by_rank[0].ppid() == agent.pid  # the worker, not its helper
    assert by_rank[None].ppid() == agent.pid and "RANK" not in by_rank[None].environ()
    assert found[3].proc.ppid() == by_rank[0].pid  # the helper, though it inherited RANK 0


def test_the_python_launchers_process_is_rank_0_and_its_children_its_helpers(tree):
    root = _spawn(tree, f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); "
                        "time.sleep(60)")
    tree.adopt(root.pid)
    found = stacks.ranked(_members(tree, 2), tree.roots, single_process=True)
    child = next(p for p in tree.members() if p.pid != root.pid)
    assert [(r.proc.pid, r.rank, r.rank_from, r.helper_of) for r in found] == [
        (root.pid, 0, "single process", None), (child.pid, None, "", 0)]


def test_a_rank_has_at_most_helpers_per_rank_of_its_helpers_dumped(tree):
    """A compiler's pool of workers below a rank: the first HELPERS_PER_RANK, by pid."""
    n = stacks.HELPERS_PER_RANK + 2
    root = _spawn(tree, f"import subprocess, sys, time\nfor _ in range({n}): "
                        f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}])\ntime.sleep(60)")
    tree.adopt(root.pid)
    found = stacks.ranked(_members(tree, n + 1), tree.roots, single_process=True)
    helpers = [r.proc.pid for r in found if r.helper_of == 0]
    assert helpers == sorted(p.pid for p in tree.members() if p.pid != root.pid)[:stacks.HELPERS_PER_RANK]


def test_take_writes_each_ranks_pyspy_dump_and_the_index(tree, tmp_path):
    root = _spawn(tree, "import time\ndef parked():\n    time.sleep(60)\nparked()", env={"RANK": "3"})
    tree.adopt(root.pid)
    time.sleep(1.0)  # py-spy needs the interpreter up
    started = time.monotonic()
    taken = stacks.take(stacks.ranked(tree.members(), tree.roots, single_process=False), tmp_path, "a test")
    took = time.monotonic() - started
    assert taken == [TakenStack(root.pid, 3, "RANK", "py-spy", "harness_stacks/rank3.txt", state="sleeping")]
    assert read_index(tmp_path) == taken
    text = (tmp_path / "harness_stacks" / "rank3.txt").read_text()
    assert text.startswith(f"=== py-spy dump of pid {root.pid}, rank 3 (RANK), taken by the harness: a test ===")
    assert parse_pyspy(text)[0].frames[0].func == "parked" and took < 5


def test_a_stopped_process_is_recorded_so_and_sent_no_sigusr1(tree, tmp_path):
    """A rank frozen by SIGSTOP: py-spy fails on it (a fake that always fails here), and a SIGUSR1
    would wait unhandled, so the note must not promise the trainer's own dump."""
    root = _spawn(tree, "import faulthandler, signal, sys, time\n"
                        "faulthandler.register(signal.SIGUSR1, file=sys.stderr)\ntime.sleep(60)", env={"RANK": "1"})
    tree.adopt(root.pid)
    time.sleep(1.0)
    os.kill(root.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(root.pid).status() != psutil.STATUS_STOPPED:  # the signal lands asynchronously
        assert time.monotonic() < deadline, psutil.Process(root.pid).status()
        time.sleep(0.05)
    fails = tmp_path / "py-spy"
    fails.write_text("#!/bin/sh\necho 'Error: Failed to get stack traces' >&2\nexit 1\n")
    fails.chmod(0o755)
    try:
        [t] = stacks.take(stacks.ranked(tree.members(), tree.roots, single_process=False), tmp_path, "a test",
                          pyspy=str(fails))
    finally:
        os.kill(root.pid, signal.SIGCONT)
    assert (t.rank, t.method, t.state) == (1, "none", "stopped"), t
    assert t.note.endswith("its process is stopped (SIGSTOP, or a debugger): it runs no handler of its own to write one")


def _record(**evidence) -> PhaseRecord:
    return PhaseRecord(PointKey("rb", "cpu", "p"), "rb/cpu/p", "train", Status.FAIL, "stalled", stalled_s=31.0,
                       world_size=2, evidence=Evidence(**evidence))


def test_a_process_of_unknown_rank_is_named_so_never_given_a_rank():
    frames = [Frame("/w/loop.py", 7, "spin"), Frame("/w/train.py", 3, "<module>")]
    rec = _record(
        stackdumps={0: StackDump("harness_stacks/rank0.txt", frames, source="py-spy")},
        unranked_stacks=[StackDump("harness_stacks/pid4242.txt", frames, source="py-spy", pid=4242),
                         StackDump("stackdump_unranked0.txt", frames[1:],
                                   "rank unknown: the trainer does not record its rank")],
        taken_stacks=[TakenStack(11, 0, "RANK", "py-spy", "harness_stacks/rank0.txt"),
                      TakenStack(4242, None, "", "py-spy", "harness_stacks/pid4242.txt"),
                      TakenStack(4343, None, "", "none", note="py-spy could not take its stack (exit 1: Error)")])
    [stall] = find([rec])
    text = stall.title + "\n" + "\n".join(stall.detail)
    assert "no progress for 31s, stopped by the harness" in stall.title
    assert "rank 0 in spin; rank unknown (pid 4242) in spin" in stall.title
    assert "rank unknown (pid 4242): stack (harness_stacks/pid4242.txt, py-spy): spin (w/loop.py:7)" in text
    assert "rank unknown (pid 4343): no stack dump [py-spy could not take its stack (exit 1: Error)]" in text
    assert "rank unknown: stack (stackdump_unranked0.txt): <module> (w/train.py:3) [rank unknown: the trainer" in text
    assert "rank 1" not in text


_HUNG = [Frame("/u/train.py", 94, "main"), Frame("/u/train.py", 136, "<module>")]


@pytest.mark.parametrize("waiting", [
    [Frame("/v/torch/autograd/graph.py", 979, "_engine_run_backward"), Frame("/u/train.py", 99, "main")],
    [Frame("/v/torch/distributed/distributed_c10d.py", 2900, "all_reduce"), Frame("/u/train.py", 99, "main")],
])
def test_a_stall_names_the_hung_rank_apart_from_the_rank_waiting_for_it(waiting):
    """Rank 1 hung in its own code in step 4 while rank 0 waited for it in the step's collective
    (DDP's gradient all-reduce waits inside the autograd engine, whose C++ frames py-spy does not
    show): the finding listed both alike, 'rank 0 in _engine_run_backward; rank 1 in main'."""
    rec = _record(stackdumps={0: StackDump("harness_stacks/rank0.txt", waiting, source="py-spy"),
                              1: StackDump("harness_stacks/rank1.txt", _HUNG, source="py-spy")},
                  last_heartbeat={0: Beat(4, "backward"), 1: Beat(4, "forward")})
    [stall] = find([rec])
    assert stall.title.endswith(f": hung: rank 1 in main; waiting for it: rank 0 in {waiting[0].func}"), stall.title


def test_a_stall_names_the_rank_behind_as_hung_when_every_stack_is_outside_a_collective():
    """A rank waiting in a barrier of the trainer's own (no torch.distributed frame): the rank
    whose heartbeats stopped a step earlier is the hung one; ranks hung alike are listed alike."""
    spin = [Frame("/u/train.py", 50, "wait_for_peers")]
    behind = _record(stackdumps={0: StackDump("harness_stacks/rank0.txt", spin, source="py-spy"),
                                 1: StackDump("harness_stacks/rank1.txt", _HUNG, source="py-spy")},
                     last_heartbeat={0: Beat(3, "optimizer"), 1: Beat(2, "optimizer")})
    assert find([behind])[0].title.endswith(": hung: rank 1 in main; waiting for it: rank 0 in wait_for_peers")
    alike = _record(stackdumps={r: StackDump(f"harness_stacks/rank{r}.txt", _HUNG, source="py-spy") for r in (0, 1)},
                    last_heartbeat={r: Beat(3, "forward") for r in (0, 1)})
    assert find([alike])[0].title.endswith(": rank 0 in main; rank 1 in main")


def _seed_dump(path, func: str) -> None:
    path.write_text(f"--- Thread: MainThread (140) ---\n  File \"/s/train_showcase.py\", line 9, in {func}\n")


@pytest.mark.parametrize("world", [1, 2])
def test_the_seed_adapter_never_guesses_a_dumps_rank(tmp_path, world):
    """The seed's dumps carry no rank and no pid (two ranks dumping in one second share a
    file): one process's latest is rank 0's, under torchrun each is rank unknown, never a rank
    assigned by the files' order."""
    from validation.contract.adapters import RunFacts, SeedAdapter
    trainer, out = tmp_path / "trainer_out", tmp_path / "run"
    trainer.mkdir()
    _seed_dump(trainer / "stackdump_100.txt", "wait_forever")
    _seed_dump(trainer / "watchdog_stackdump_101.txt", "step")
    SeedAdapter().convert(trainer, out, RunFacts(world, "seed"))
    dumps = sorted(p.name for p in out.glob("stackdump_*.txt"))
    if world == 1:
        assert dumps == ["stackdump_rank0.txt"] and "in step" in (out / dumps[0]).read_text()
    else:
        assert dumps == ["stackdump_unranked0.txt", "stackdump_unranked1.txt"]
        assert "rank unknown" in (out / dumps[1]).read_text()


def test_stall_evidence_survives_the_store():
    rec = _record(stackdumps={1: StackDump("stackdump_rank1.txt", [Frame("a.py", 1, "f")], source="SIGUSR1")},
                  taken_stacks=[TakenStack(9, 1, "RANK", "SIGUSR1", note="py-spy could not")])
    back = PhaseRecord.from_json(rec.to_json(), "test")
    assert back == rec and back.evidence.stackdumps[1].source == "SIGUSR1" and back.stalled_s == 31.0


@pytest.mark.parametrize("world, dumps, advice", [
    (2, True, "a rank inside a collective"),
    (1, True, "The stack shows where the process waited"),
    (2, False, "No stack could be taken"),
    (1, False, "No stack could be taken"),
])
def test_stall_advice_fits_what_is_known(world, dumps, advice):
    # without dumps: py-spy was tried and could not take the rank's stack (with no attempt at all,
    # no rank was left running, which has advice of its own: test_advice.py)
    rec = _record(stackdumps={0: StackDump("harness_stacks/rank0.txt", [Frame("a.py", 1, "f")])} if dumps else {},
                  taken_stacks=[] if dumps else [TakenStack(9, 0, "RANK", "none", note="py-spy could not")])
    rec.world_size = world
    [line] = recommendations(find([rec]))
    assert advice in line
    assert ("collective" in line) == (world > 1 and dumps)  # collective advice: more than one process
    assert line.split(": ", 1)[1].startswith("The stack") == dumps  # stacks cited only when they exist


def test_the_process_a_ranks_heartbeats_name_is_that_rank_not_the_launcher_above_it(tree):
    """A trainer whose launched process supervises a worker that trains (restarting it when it dies)
    hung in the worker; the stall finding named rank 0 'in Popen._try_wait', the supervisor's wait.
    The worker's heartbeats carry its pid (the contract's field for this): that process is rank 0."""
    root = _spawn(tree, f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]).wait()")
    tree.adopt(root.pid)
    members = _members(tree, 2)
    worker = next(p for p in members if p.pid != root.pid)
    found = stacks.ranked(members, tree.roots, single_process=True, beat_pids={worker.pid: 0})
    assert [(r.proc.pid, r.rank, r.rank_from) for r in found] == [(worker.pid, 0, "heartbeat pid")]
    # a pid of no process of the run changes nothing
    found = stacks.ranked(members, tree.roots, single_process=True, beat_pids={1: 0})
    assert [(r.proc.pid, r.rank, r.rank_from, r.helper_of) for r in found] == [
        (root.pid, 0, "single process", None), (worker.pid, None, "", 0)]  # the worker then its helper


def test_the_watch_keeps_each_ranks_latest_heartbeat_pid(tmp_path):
    from validation.launch.watch import StepWatch
    (tmp_path / "heartbeat_rank0.jsonl").write_text(
        '{"time": 1, "step": 1, "pid": 11}\n{"time": 2, "step": 2, "pid": 12}\n')
    (tmp_path / "heartbeat_rank1.jsonl").write_text('{"time": 1, "step": 1, "pid": 21}\n{"time": 2, "step": 2}\n')
    watch = StepWatch(tmp_path, tmp_path / "training.csv")
    watch.look()
    assert watch.pids == {12: 0, 21: 1}


@pytest.mark.parametrize("waiting", [
    [Frame("/v/torch/autograd/graph.py", 979, "_engine_run_backward"), Frame("/w/train/loop.py", 351, "forward_backward")],
    [Frame("/w/train/loop.py", 396, "train_step"), Frame("/w/train/loop.py", 529, "run_step")],
], ids=["gloo", "nccl"])
def test_a_frozen_rank_of_no_stack_is_the_hung_one_not_the_rank_that_waited(waiting):
    """Rank 1 frozen by SIGSTOP at step 3's forward: no stack (py-spy fails, its handler is stopped);
    rank 0 waits, over gloo in DDP's backward, over NCCL in a CUDA synchronisation in train_step,
    which shows no collective frame (two H200s, 2026-11-27). Both read 'rank 0 in ...' as if rank 0
    were the only rank to blame."""
    rec = _record(
        stackdumps={0: StackDump("stackdump_rank0.txt", waiting), 1: StackDump("stackdump_rank1.txt", [])},
        taken_stacks=[TakenStack(12, 1, "RANK", "none", state="stopped",
                                 note="py-spy could not take its stack (exit 1: Error: Failed to get stack traces)")],
        last_heartbeat={0: Beat(3, "optimizer" if waiting[0].func == "train_step" else "backward"),
                        1: Beat(3, "forward")})
    [stall] = find([rec])
    assert stall.title.endswith(
        "hung: rank 1 (no stack; its process stopped, by SIGSTOP or a debugger; last heartbeat step 3, stage forward); "
        f"waiting for it: rank 0 in {waiting[0].func}"), stall.title
