"""Ranks come from env.json, and a stack dump carries its rank only where the files say it (issue
24, case 2). The seed adapter once numbered stack dumps by time: a hang of rank 1 alone was
reported as "rank 0 in main", a single process's hang named a "rank 1" that does not exist, and
two ranks' dumps written in the same second lost one of them without a word."""
from __future__ import annotations

import io
import json
from pathlib import Path

from nsa.contract import CSV_COLUMNS
from validation.contract import check as contract
from validation.judge import check_command as check_artifacts
from validation.contract.adapters import ADAPTERS, RunFacts
from validation.contract.stacks import TakenStack, write_index
from validation.judge.evidence import collect, read_train
from validation.judge.findings import find
from validation.judge.metrics import RunData
from validation.judge.record import PhaseRecord, PointKey, Status, Summary

FAULTHANDLER = 'Current thread 0x00007f0000000001 (most recent call first):\n  File "/x/train.py", line 7 in {func}\n' \
               '  File "/x/train.py", line 1 in <module>\n'


def _contract_dir(path: Path, world: int, beats: tuple[int, ...], dumps: tuple[int, ...]) -> Path:
    path.mkdir()
    (path / "training.csv").write_text(",".join(CSV_COLUMNS) + "\n1,2.0,1e-4,100,0.1,1,0.5,1\n")
    (path / "env.json").write_text(json.dumps({"world_size": world}))
    for r in beats:
        (path / f"heartbeat_rank{r}.jsonl").write_text(json.dumps({"time": 1.0, "step": 1, "rank": r}) + "\n")
    for r in dumps:
        (path / f"stackdump_rank{r}.txt").write_text(FAULTHANDLER.format(func=f"wait_{r}"))
    return path


def _check(directory: Path) -> tuple[int, str]:
    out = io.StringIO()
    return check_artifacts.check(directory, out=out), out.getvalue()


def test_a_stack_dump_of_a_rank_that_does_not_exist_is_malformed(tmp_path):
    d = _contract_dir(tmp_path / "one", world=1, beats=(0,), dumps=(0, 1))
    rc, text = _check(d)
    assert rc == 1 and "malformed            stackdump_rank1.txt: rank 1 does not exist (env.json world_size 1)" in text
    assert "present              stackdump_rank0.txt: stack dump of rank 0" in text


def test_a_heartbeat_of_a_rank_that_does_not_exist_is_malformed(tmp_path):
    d = _contract_dir(tmp_path / "two", world=2, beats=(0, 1, 3), dumps=())
    rc, text = _check(d)
    assert rc == 1 and "malformed            heartbeat_rank3.jsonl: rank 3 does not exist (env.json world_size 2)" in text
    (d / "heartbeat_rank3.jsonl").unlink()
    (d / "heartbeat_rank1.jsonl").write_text(json.dumps({"time": 1.0, "step": 1, "rank": 0}) + "\n")
    rc, text = _check(d)
    assert rc == 1 and "heartbeat_rank1.jsonl: record 1 says rank 0 in the file of rank 1" in text


def _stalled(run: RunData, tmp_path: Path, world: int) -> PhaseRecord:
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    return PhaseRecord(PointKey("rb", "cpu", "long_run"), "rb/cpu/long_run/default", "train", Status.FAIL, "timed out",
                       timed_out=True, timeout_s=60, world_size=run.world_size,
                       evidence=collect(run, tmp_path / "none.log", errors), out_dir="x")


def test_a_single_process_hang_names_no_rank_that_does_not_exist(tmp_path):
    d = _contract_dir(tmp_path / "one", world=1, beats=(0,), dumps=(0, 1))
    # one process launched (the world size a point starts its RunData with); env.json says 1 too.
    # (A launch of 2 with env.json saying 1 is env.json's error, and both are ranks: the test below.)
    rec = _stalled(RunData(d, world_size=1), tmp_path, 1)
    assert rec.world_size == 1 and set(rec.evidence.stackdumps) == {0}
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert stall.title.endswith("rank 0 in wait_0") and "rank 1" not in stall.title + "".join(stall.detail)
    assert any("stackdump_rank1.txt: malformed" in e for e in rec.evidence.errors)


def test_an_empty_stack_dump_is_named_as_empty_and_counted_as_absent(tmp_path):
    """A SIGKILLed rank leaves the stackdump_rank{R}.txt it opened for faulthandler with nothing in
    it: check-artifacts listed it as 'present ... stack dump of rank 1'."""
    d = _contract_dir(tmp_path / "two", world=2, beats=(0, 1), dumps=(0,))
    (d / "stackdump_rank1.txt").write_text("")
    (d / "stackdump_unranked0.txt").write_text(" \n\t\n")
    rc, text = _check(d)
    assert rc == 0, text  # an optional file: absent, not broken
    assert "present              stackdump_rank0.txt: stack dump of rank 0" in text
    assert ("empty                stackdump_rank1.txt: 0 bytes: counted as no stack dump of rank 1; expected Python "
            "faulthandler output of rank 1's threads") in text, text
    assert ("empty                stackdump_unranked0.txt: 4 bytes, whitespace only: counted as no stack dump of a "
            "rank the trainer's files do not name") in text, text
    assert "present              stackdump_rank1.txt" not in text and "present              stackdump_unranked0" not in text


def test_an_empty_stack_dump_is_no_stack_of_its_rank_in_the_judge(tmp_path):
    """The judge read an empty trainer dump as rank 1's stack, and an empty py-spy dump of the
    harness's own (py-spy wrote nothing) in place of rank 0's own dump, which held its frames: the
    stall finding then said 'no stack dump' of rank 0."""
    d = _contract_dir(tmp_path / "two", world=2, beats=(0, 1), dumps=(0,))
    (d / "stackdump_rank1.txt").write_text("\n")
    (d / "stackdump_unranked0.txt").write_text("")
    write_index(d, [TakenStack(pid=11, rank=0, rank_from="RANK", method="py-spy", path="harness_stacks/rank0.txt")])
    (d / "harness_stacks" / "rank0.txt").write_text("  \n")
    rec = _stalled(RunData(d, world_size=2), tmp_path, 2)
    assert set(rec.evidence.stackdumps) == {0} and rec.evidence.unranked_stacks == []
    assert rec.evidence.stackdumps[0].path == "stackdump_rank0.txt" and rec.evidence.stackdumps[0].frames
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert "rank 0: last heartbeat step 1, stage ?; stack (stackdump_rank0.txt): wait_0" in "\n".join(stall.detail)
    assert "rank 1: last heartbeat step 1, stage ?; no stack dump" in stall.detail, stall.detail
    assert "rank unknown" not in "\n".join(stall.detail)
    # the report's list of the point's artifacts names the folder of the stacks the findings cite
    assert "harness_stacks/" in rec.evidence.files and "stackdump_rank0.txt" in rec.evidence.files


# --- the seed adapter ----------------------------------------------------------------------------

def _main_thread(func: str) -> str:
    """The seed's dump of a main thread: ``traceback.format_stack``, its own handler on top."""
    return ("--- Thread: MainThread (140000000000001) ---\n"
            '  File "/seed/scripts/train_showcase.py", line 1500, in <module>\n    main()\n'
            f'  File "/seed/scripts/train_showcase.py", line 900, in {func}\n    x()\n'
            '  File "/seed/scripts/train_showcase.py", line 212, in dump_stack\n    f.write()\n')


def _seed_dump(header: str, func: str) -> str:
    return f"{header}\n\n{_main_thread(func)}"


def _seed_dir(path: Path, world: int, beats: dict[int, list[dict]]) -> Path:
    path.mkdir()
    (path / "training.csv").write_text("1,5.0,1e-4,100\n")
    env = {"env": {"WORLD_SIZE": str(world)}} if world > 1 else {"env": {}}
    (path / "env.json").write_text(json.dumps(env))
    for rank, recs in beats.items():
        (path / f"heartbeat_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _beat(rank: int, step: int, msg: str = "beat", **extra) -> dict:
    return {"ts": 1000.0 + step, "pid": 4000 + rank, "rank": rank, "step": step, "msg": msg, **extra}


def _convert(src: Path, out: Path, world: int) -> contract.ContractRead:
    ADAPTERS["seed"].convert(src, out, RunFacts(world, "seed"))
    return contract.read(out)


def test_seed_watchdog_dump_takes_the_rank_its_heartbeat_file_announced(tmp_path):
    """Rank 1 alone hangs: its own watchdog's dump is announced in heartbeat_rank1.jsonl."""
    src = _seed_dir(tmp_path / "seed", 2, {0: [_beat(0, 1), _beat(0, 2)],
                                           1: [_beat(1, 1), _beat(1, 0, "watchdog_dump",
                                                                   path=str(tmp_path / "seed/watchdog_stackdump_1700.txt"))]})
    (src / "watchdog_stackdump_1700.txt").write_text(_seed_dump("Watchdog at 2025-01-01T00:00:00Z", "only_rank_1_runs"))
    found = _convert(src, tmp_path / "out", 2)
    assert found.ok and sorted(p.name for p in (tmp_path / "out").glob("stackdump_*")) == ["stackdump_rank1.txt"]
    text = (tmp_path / "out" / "stackdump_rank1.txt").read_text()
    assert "rank 1 (announced in heartbeat_rank1)" in text and "only_rank_1_runs" in text


def test_seed_signal_dumps_of_several_ranks_are_rank_unknown_never_numbered_by_time(tmp_path):
    src = _seed_dir(tmp_path / "seed", 2, {0: [_beat(0, 1)], 1: [_beat(1, 1)]})
    (src / "stackdump_1700.txt").write_text(_seed_dump("Signal 10 at 2025-01-01T00:00:00Z", "only_rank_1_runs"))
    found = _convert(src, tmp_path / "out", 2)
    assert found.ok and sorted(p.name for p in (tmp_path / "out").glob("stackdump_*")) == ["stackdump_unranked0.txt"]
    rec = _stalled(RunData(tmp_path / "out", world_size=2), tmp_path, 2)
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert stall.title.endswith(": rank unknown in only_rank_1_runs"), stall.title
    assert "rank 0: last heartbeat step 1, stage data; no stack dump" in stall.detail
    assert any("record neither rank nor pid" in d for d in stall.detail)


def test_seed_dump_of_a_single_process_is_rank_0(tmp_path):
    src = _seed_dir(tmp_path / "seed", 1, {0: [_beat(0, 1)]})
    (src / "stackdump_1700.txt").write_text(_seed_dump("Signal 10 at 2025-01-01T00:00:00Z", "hang_here"))
    (src / "stackdump_1702.txt").write_text(_seed_dump("Signal 15 at 2025-01-01T00:00:02Z", "later_here"))
    found = _convert(src, tmp_path / "out", 1)
    assert found.ok and sorted(p.name for p in (tmp_path / "out").glob("stackdump_*")) == ["stackdump_rank0.txt"]
    text = (tmp_path / "out" / "stackdump_rank0.txt").read_text()
    assert "later_here" in text and "earlier dumps of this rank: stackdump_1700.txt" in text


def test_two_ranks_dumps_in_one_file_are_split_and_said(tmp_path):
    """Both ranks dumped in the same second: one file name, two dumps in it."""
    src = _seed_dir(tmp_path / "seed", 2, {0: [_beat(0, 1)], 1: [_beat(1, 1)]})
    both = _seed_dump("Signal 10 at 2025-01-01T00:00:00Z", "rank_a") + _seed_dump("Signal 10 at 2025-01-01T00:00:00Z", "rank_b")
    (src / "stackdump_1700.txt").write_text(both)
    found = _convert(src, tmp_path / "out", 2)
    names = sorted(p.name for p in (tmp_path / "out").glob("stackdump_*"))
    assert found.ok and names == ["stackdump_unranked0.txt", "stackdump_unranked1.txt"]
    texts = [(tmp_path / "out" / n).read_text() for n in names]
    assert "rank_a" in texts[0] and "rank_b" in texts[1]
    assert all("one of 2 dumps in that file" in t for t in texts)
    # the later writer's dump over the start of the earlier one's: no second header, but a second
    # main thread, which one process does not have
    (src / "stackdump_1700.txt").write_text(_seed_dump("Signal 10 at 2025-01-01T00:00:00Z", "rank_b") + _main_thread("rank_a"))
    found = _convert(src, tmp_path / "out2", 2)
    assert found.ok and len(list((tmp_path / "out2").glob("stackdump_unranked*.txt"))) == 2



def test_a_rank_whose_heartbeats_went_to_a_rank_that_does_not_exist_is_not_called_idle(tmp_path):
    """Rank 1 of 2 wrote heartbeat_rank5.jsonl: the file is malformed (the point's ERROR, naming
    it), and rank 1 has no heartbeat file of its own, so idle_ranks counts it; the report said
    beside the error that it 'did no work', of a rank that ran every step."""
    d = _contract_dir(tmp_path / "two", world=2, beats=(0, 5), dumps=())
    for r in (0, 5):  # two steps each: rank 0 made progress, and rank 1 did too, in rank 5's file
        (d / f"heartbeat_rank{r}.jsonl").write_text("".join(
            json.dumps({"time": float(s), "step": s, "rank": min(r, 1)}) + "\n" for s in (1, 2)))
    run = RunData(d, world_size=2, exit_code=0)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    assert errors and "heartbeat_rank5.jsonl" in errors[0]
    rec = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.ERROR, errors[0],
                      exit_code=0, world_size=2, evidence=collect(run, tmp_path / "none.log", errors), out_dir="x",
                      metrics=Summary.of(run, None))
    assert rec.metrics.idle_ranks == 1
    assert [f.kind for f in find([rec])] == ["artifacts"], [f.title for f in find([rec])]


def test_env_json_naming_fewer_ranks_than_were_launched_is_its_error_and_the_hang_keeps_its_rank(tmp_path):
    """user7's pass: a trainer under torchrun x2 wrote env.json world_size 1, and its rank 1 hung
    while rank 0 waited in a collective. Rank 1's heartbeats and the stack the harness took of it
    were dropped as 'a rank that does not exist', the stall was blamed on rank 0 alone, and the
    error named heartbeat_rank1.jsonl, not env.json. Two processes were launched: both are ranks,
    and env.json's world_size is what is wrong."""
    d = _contract_dir(tmp_path / "two", world=1, beats=(0, 1), dumps=(0, 1))
    (d / "heartbeat_rank0.jsonl").write_text(json.dumps({"time": 2.0, "step": 3, "rank": 0, "stage": "backward"}) + "\n")
    (d / "heartbeat_rank1.jsonl").write_text(json.dumps({"time": 1.0, "step": 3, "rank": 1, "stage": "forward"}) + "\n")
    rec = _stalled(RunData(d, world_size=2), tmp_path, 2)  # launched: torchrun x2
    assert rec.world_size == 2 and set(rec.evidence.stackdumps) == {0, 1}, rec.evidence.stackdumps
    assert not any("heartbeat_rank1.jsonl" in e or "stackdump_rank1.txt" in e for e in rec.evidence.errors), \
        rec.evidence.errors
    assert any("env.json world_size: malformed" in e and "2 processes were launched" in e
               for e in rec.evidence.errors), rec.evidence.errors
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert "rank 1" in stall.title, stall.title
    # check-artifacts, told the world size, says the same of env.json
    rc, text = _check_world(d, 2)
    assert rc == 1 and "malformed            env.json world_size: 1, but 2 processes were launched" in text, text


def _check_world(directory: Path, world: int) -> tuple[int, str]:
    out = io.StringIO()
    return check_artifacts.check(directory, world_size=world, out=out), out.getvalue()


def _interleaved(path: Path, said: tuple[int, int]) -> Path:
    """heartbeat_rank0.jsonl written by two processes at once, one per node, as two nodes' ranks
    write it when a trainer names its file by LOCAL_RANK; ``said``: the rank each one's records say."""
    path = _contract_dir(path, 2, (), ())
    recs = []
    for step in range(1, 4):
        for node, (pid, rank) in enumerate(zip((11, 12), said)):
            recs += [{"time": step + node / 10, "step": step, "stage": stage, "rank": rank, "pid": pid, "node": node,
                      "host": "vm"} for stage in ("forward", "step")]
    recs.sort(key=lambda r: (r["step"], r["stage"] == "step", r["node"]))  # each stage of both, then the next
    (path / "heartbeat_rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_two_ranks_writing_one_heartbeat_file_is_said_once_not_as_steps_gone_back(tmp_path):
    """Two nodes x1 of a trainer that named its heartbeat file by LOCAL_RANK (2026-11-28): both
    ranks appended to heartbeat_rank0.jsonl, and check-artifacts listed 15 'went back from step N'
    entries of a resume in place, and, where the records said each writer's rank, 'record 2 says
    rank 1 in the file of rank 0' beside them."""
    code, out = _check(_interleaved(tmp_path / "ranks", said=(0, 1)))
    assert code == check_artifacts.EXIT_BROKEN, out
    [line] = [ln for ln in out.splitlines() if "heartbeat_rank0.jsonl" in ln and "malformed" in ln]
    assert "heartbeat_rank0.jsonl: 2 ranks wrote this one file at once, their records interleaved: pid 11 (rank 0, " \
           "node 0, host vm); pid 12 (rank 1, node 1, host vm)" in line, out
    assert "went back" not in out and "says rank" not in out, out
    # records that say one rank: the processes are told apart by their pids
    code, out = _check(_interleaved(tmp_path / "local", said=(0, 0)))
    assert code == check_artifacts.EXIT_BROKEN, out
    assert "heartbeat_rank0.jsonl: 2 processes wrote this one file at once, their records interleaved: pid 11 (rank " \
           "0, node 0, host vm); pid 12 (rank 0, node 1, host vm)" in out, out
    assert "went back" not in out, out
    # the judge reads the same: the point's error names the file
    run = RunData(tmp_path / "local", world_size=2)
    errors: list[str] = []
    files = read_train(run)
    run = files.onto(run)
    errors += files.problems
    assert [e for e in errors if "heartbeat_rank0.jsonl: malformed (2 processes wrote this one file" in e], errors


def test_env_json_naming_more_ranks_than_were_launched_is_its_error(tmp_path):
    """A user's pass: under torchrun x2 a trainer wrote world_size 4. Ranks 2 and 3 were then
    counted idle ('did no work') and the point passed its gates; torchrun's world is the processes
    it started, so env.json is what is wrong. One process (the python launcher) may start its own
    ranks: there a world_size above one is the trainer's to say."""
    d = _contract_dir(tmp_path / "four", world=4, beats=(0, 1), dumps=())
    rc, text = _check_world(d, 2)
    assert rc == 1 and "malformed            env.json world_size: 4, but 2 processes were launched" in text, text
    spawned = _contract_dir(tmp_path / "spawned", world=2, beats=(0, 1), dumps=())
    rc, text = _check_world(spawned, 1)
    assert rc == 0 and "malformed" not in text, text


def test_a_rank_that_wrote_no_heartbeat_file_is_said_to_have_broken_the_contract_not_to_have_done_no_work(tmp_path):
    """A user pass: rank 1 of a DDP run took part in every all-reduce and wrote no
    heartbeat file at all. The NO-GO is right (every rank writes its own), but the finding said 'idle
    rank ...: 1 of 2 rank(s) did no work', which its files cannot say. It says what they show."""
    d = _contract_dir(tmp_path / "two", world=2, beats=(0,), dumps=())
    (d / "heartbeat_rank0.jsonl").write_text("".join(
        json.dumps({"time": float(s), "step": s, "rank": 0, "stage": "step"}) + "\n" for s in (1, 2)))
    run = RunData(d, world_size=2, exit_code=0)
    run = read_train(run).onto(run)
    rec = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL,
                      "idle_ranks = 1, needs == 0", exit_code=0, world_size=2, out_dir="x",
                      evidence=collect(run, tmp_path / "none.log", []), metrics=Summary.of(run, None))
    assert rec.metrics.idle_ranks == 1
    [f] = [f for f in find([rec]) if f.severity.value == "critical"]
    assert f.kind == "artifacts" and "did no work" not in f.title, f.title
    assert f.title == ("ddp [default]: rank 1 of 2 wrote no heartbeat (heartbeat_rank1.jsonl not written), which the "
                       "contract asks of every rank: whether it did work, its files cannot tell"), f.title
    # a rank whose file holds records and no step progress did no work, as before
    (d / "heartbeat_rank1.jsonl").write_text(json.dumps({"time": 1.0, "step": 0, "rank": 1, "stage": "data"}) + "\n")
    run = read_train(RunData(d, world_size=2, exit_code=0)).onto(RunData(d, world_size=2, exit_code=0))
    idle = PhaseRecord(PointKey("rb", "cpu", "ddp"), "rb/cpu/ddp/default", "train", Status.FAIL, "", exit_code=0,
                       world_size=2, out_dir="x", evidence=collect(run, tmp_path / "none.log", []),
                       metrics=Summary.of(run, None))
    assert [f.title for f in find([idle]) if f.kind == "idle"] == ["idle rank in ddp [default]: 1 of 2 rank(s) did no work"]
