"""A rank whose heartbeats stop before the run's last step while the run ends with exit 0: its files
cannot tell a rank that exited early from one that ran on without writing them, and the finding
said both ("it left early or trained on without writing them"). The harness watches the process
tree itself: where it saw the process whose pid the rank's heartbeats carry end before the run got
past a step short of its last, the finding says it left early; where it saw it still running when
the run reached its last step, that it had not exited (validation/launch/lives.py)."""
from __future__ import annotations

from types import SimpleNamespace

import yaml

from validation.cli import main
from validation.judge.record import Beat, PhaseRecord, Status
from validation.judge.seen import ProcessSeen
from validation.judge.verdict import rejudge
from validation.launch.lives import Lives
from validation.store.results import ResultStore

#: a trainer of my own, from docs/artifact_contract.md: torchrun's ranks share no collective (each
#: trains alone), rank 1 exits 0 as step 4 starts (``quit``) or stops writing heartbeats there and
#: trains on (``mute``) and ends a second after its last step; rank 0 logs all 12 steps of 0.15 s
TRAINER = """
import json, os, socket, sys, time
steps, out, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.makedirs(out, exist_ok=True)
if rank == 0:
    json.dump({"world_size": world, "contract_version": 2, "git_sha": "0" * 40}, open(f"{out}/env.json", "w"))
    csv = open(f"{out}/training.csv", "w", buffering=1)
    csv.write("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\\n")
hb = open(f"{out}/heartbeat_rank{rank}.jsonl", "a", buffering=1)
def beat(step, stage):
    if rank == 1 and step >= 4 and mode == "mute":
        return
    hb.write(json.dumps({"time": time.time(), "step": step, "rank": rank, "pid": os.getpid(), "stage": stage,
                         "host": socket.gethostname()}) + "\\n")
for step in range(1, steps + 1):
    if rank == 1 and step == 4 and mode == "quit":
        sys.exit(0)
    beat(step, "forward")
    time.sleep(0.15)
    beat(step, "step")
    if rank == 0:
        csv.write(f"{step},{3 - 0.1 * step:.3f},0.1,1000,0.15,1.0,0.1,0.1\\n")
if rank == 1:
    time.sleep(1.0)  # a slow end: running when the run reached its last step, whatever the polls' phase
"""


def _run(tmp_path, monkeypatch, mode: str) -> PhaseRecord:
    root = tmp_path / "trainer"
    root.mkdir()
    (root / "train.py").write_text(TRAINER)
    monkeypatch.setenv("MY_TRAINER_ROOT", str(root))
    trainer = {"name": "mine", "root": {"env": "MY_TRAINER_ROOT"}, "script": "train.py",
               "args": ["{steps}", "{out_dir}", mode]}
    rb = tmp_path / "rb.yaml"
    rb.write_text(yaml.safe_dump({
        "name": "mine", "profiles": ["cpu"], "trainer": trainer,
        "defaults": {"steps": 12, "timeout_s": 120, "launcher": {"kind": "torchrun", "nproc": 2}},
        "phases": [{"name": "ranks", "kind": "train", "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}]}))
    res = tmp_path / "res"
    assert main(["run", "--runbook", str(rb), "--results-dir", str(res), "--no-plots"]) == 1
    (rec,) = ResultStore(res).records()
    assert rec.exit_code == 0 and rec.metrics.steps_completed == 12 and rec.status == Status.FAIL, rec.reason
    return rec


def test_a_rank_whose_process_exited_early_is_said_to_have_left(tmp_path, monkeypatch):
    rec = _run(tmp_path, monkeypatch, "quit")
    seen = rec.evidence.rank_processes[1]
    assert seen.gone_at is not None and seen.gone_at < 12, seen
    assert rec.reason.startswith(
        "rank 1's heartbeats stop after step 3 of 12 (its last heartbeat: step 3, stage step; the run completed step "
        "12): it left early: it started no step after step 3, the last it completed (its last heartbeat marks that "
        f"step's end), and its process (pid {seen.pid}, its heartbeats') had exited by the time the run reached step "
        f"{seen.gone_at}, exit 0"), rec.reason
    assert "trained on" not in rec.reason
    # the stored record says the same when the report judges it again
    stored = PhaseRecord.from_json(rec.to_json(), "test")
    assert stored.evidence.rank_processes == rec.evidence.rank_processes
    assert rejudge(stored, stored.gates).reason == rec.reason


def test_a_rank_whose_process_ran_to_the_end_is_said_not_to_have_exited(tmp_path, monkeypatch):
    rec = _run(tmp_path, monkeypatch, "mute")
    seen = rec.evidence.rank_processes[1]
    assert seen.alive_at == 12, seen
    assert f"its process (pid {seen.pid}, its heartbeats') had not exited when the run reached step 12: it trained " \
           "on without writing them, or stopped and took that long to end" in rec.reason, rec.reason
    assert "left early" not in rec.reason
    # a record of an older harness has no process of it: the finding says both, as the files do
    old = rec.to_json()
    del old["evidence"]["rank_processes"]
    stored = PhaseRecord.from_json(old, "test")
    assert stored.evidence.rank_processes == {}
    assert "it left early or trained on without writing them" in rejudge(stored, stored.gates).reason


def _proc(pid: int, born: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(pid=pid, create_time=lambda: born)


def test_each_process_is_placed_by_reads_of_the_files_around_the_look():
    lives = Lives(launched={1})
    lives.poll([_proc(1), _proc(10), _proc(11)], 2)  # the files showed step 2, then both were running
    lives.poll([_proc(1), _proc(10)], 3)             # 11 found gone after a read that showed step 3 ...
    assert lives.seen()[11] == ProcessSeen(11, 2)    # ... when it ended is bounded by the next read only
    lives.poll([_proc(1), _proc(10)], 5)
    assert lives.seen() == {10: ProcessSeen(10, 5), 11: ProcessSeen(11, 2, gone_at=5)}  # no launched process
    lives.poll([_proc(1), _proc(11, born=9.0)], 6)   # pid 11 again, another process: it names neither
    assert 11 not in lives.seen()


def test_a_beat_names_its_pid_and_a_rank_its_process():
    from validation.judge.record import rank_processes

    beat = Beat.of([{"time": 1.0, "step": 3, "stage": "step", "pid": 42}])
    assert beat.pid == 42 and Beat.of([{"time": 1.0, "step": 3, "pid": "42"}]).pid is None
    seen = {42: ProcessSeen(42, 8)}
    assert rank_processes({1: beat, 0: Beat(step=8)}, seen) == {1: seen[42]}


def test_a_launched_process_is_not_followed():
    """The one process of a python launcher, a torchrun agent or srun is no rank of a world of several."""
    lives = Lives(launched={7})
    lives.poll([_proc(7)], 1)
    assert lives.seen() == {}
