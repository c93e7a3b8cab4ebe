"""The harness's own progress watch (validation/launch/watch.py): the highest step in the
heartbeats and the training CSV, read from the bytes appended since the last look; and the
progress line a running point prints (validation/launch/kinds.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

from validation.launch.kinds import StepProgress
from validation.launch.legs import legs
from validation.launch.watch import StepWatch

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"


def _beat(step, **extra) -> str:
    return json.dumps({"time": 1.0, "rank": 0, "step": step, "stage": "forward", **extra}) + "\n"


def test_progress_is_the_highest_step_of_heartbeats_and_csv(tmp_path):
    watch = StepWatch(tmp_path, tmp_path / "training.csv")
    assert not watch.look() and watch.highest is None  # nothing written yet
    (tmp_path / "training.csv").write_text(HEADER + "1,5.0,0.1,10,0.1,1,0,0\n")
    assert watch.look() and watch.highest == 1
    (tmp_path / "heartbeat_rank1.jsonl").write_text(_beat(1) + _beat(2))
    assert watch.look() and watch.highest == 2
    with open(tmp_path / "heartbeat_rank1.jsonl", "a") as fh:
        fh.write(_beat(2, stage="backward"))  # a new stage of the same step is no progress
    assert not watch.look() and watch.highest == 2


def test_a_step_begun_is_still_start_up_and_its_end_is_progress(tmp_path):
    """The project's trainer writes step 1's 'data' and 'forward' records before its first step runs:
    the stall allowance switched from startup_s to stall_s there. A step is done once a record of a
    stage after it, a CSV row or a record of a later step says so; that end is progress (the stall
    clock starts there, not at the step's first record)."""
    watch = StepWatch(tmp_path, tmp_path / "training.csv")
    (tmp_path / "heartbeat_rank0.jsonl").write_text(_beat(1, stage="data") + _beat(1))
    assert watch.look() and watch.highest == 1 and not watch.stepped
    with open(tmp_path / "heartbeat_rank0.jsonl", "a") as fh:
        fh.write(_beat(1, stage="backward"))
    assert not watch.look() and not watch.stepped
    with open(tmp_path / "heartbeat_rank0.jsonl", "a") as fh:
        fh.write(_beat(1, stage="step"))
    assert watch.look() and watch.stepped  # the first step done: progress, though no new step number
    with open(tmp_path / "heartbeat_rank0.jsonl", "a") as fh:
        fh.write(_beat(1, stage="checkpoint"))
    assert not watch.look()
    later = StepWatch(tmp_path / "x", tmp_path / "x" / "training.csv")  # a format whose records begin steps only
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "heartbeat_rank0.jsonl").write_text(_beat(1))
    assert later.look() and not later.stepped
    (tmp_path / "x" / "heartbeat_rank0.jsonl").write_text(_beat(1) + _beat(2))
    assert later.look() and later.stepped


def test_a_line_is_read_once_complete(tmp_path):
    path = tmp_path / "heartbeat_rank0.jsonl"
    watch = StepWatch(tmp_path, tmp_path / "training.csv")
    line = _beat(7)
    path.write_text(line[:10])
    assert not watch.look()
    with open(path, "a") as fh:
        fh.write(line[10:])
    assert watch.look() and watch.highest == 7


def test_only_appended_bytes_are_read(tmp_path):
    """Bytes already read are not read again: a step written over them in place goes unseen,
    the appended one is seen."""
    path = tmp_path / "heartbeat_rank0.jsonl"
    path.write_text("".join(_beat(s) for s in range(1000, 2000)))
    watch = StepWatch(tmp_path, tmp_path / "training.csv")
    assert watch.look() and watch.highest == 1999
    with open(path, "r+b") as fh:  # same file, same size: the first record now says step 9999
        fh.write(_beat(9999).encode())
    with open(path, "a") as fh:
        fh.write(_beat(2000))
    assert watch.look() and watch.highest == 2000


def test_a_file_written_anew_is_read_from_its_start(tmp_path):
    """A trainer that restarts truncates its files (or writes new ones): read them again."""
    csv = tmp_path / "training.csv"
    csv.write_text(HEADER + "".join(f"{s},5,0.1,10,0.1,1,0,0\n" for s in range(1, 40)))
    watch = StepWatch(tmp_path, csv)
    watch.look()
    csv.write_text(HEADER)  # shorter: a new run of the same directory
    assert not watch.look()
    with open(csv, "a") as fh:
        fh.write("41,5,0.1,10,0.1,1,0,0\n")
    assert watch.look() and watch.highest == 41


def test_headerless_csv_torn_and_odd_records_are_no_step(tmp_path):
    """The seed trainer's CSV has no header; a record's step must be an integer."""
    csv = tmp_path / "training.csv"
    csv.write_text("3,5.0,0.1,10\nstep,loss\n")
    (tmp_path / "heartbeat_rank0.jsonl").write_text(_beat(True) + _beat("9") + '{"step": 99' + "\n[1]\n")
    (tmp_path / "heartbeat_rankX.jsonl").write_text(_beat(50))  # not a heartbeat file of the contract
    watch = StepWatch(tmp_path, csv)
    assert watch.look() and watch.highest == 3


def test_the_progress_line_says_how_long_no_step_came_instead_of_a_growing_eta(tmp_path):
    """During a stall the line's ETA kept growing ('ETA 4408s', two torchrun nodes, one hung)."""
    csv = tmp_path / "training.csv"
    point = SimpleNamespace(test_id="rb/cpu/p/default", phase=SimpleNamespace(steps=100, kind="train",
                                                                              stall_after_s=300.0))
    lines: list[str] = []
    progress = StepProgress(point, csv, lines.append)
    for step, elapsed in ((1, 1.0), (2, 2.0), (3, 3.0)):  # a step a second
        csv.write_text(HEADER + "".join(f"{s},5.0,0.1,1000,1.0,1,0,0\n" for s in range(1, step + 1)))
        progress(elapsed)
    assert lines[-1] == "rb/cpu/p/default:     3s step 3/100, 1,000 tok/s (global), ETA 97s"
    progress(9.0)  # 6 s without a step: within max(10 s, 3 steps) still an ETA, from the steps' pace
    assert lines[-1].endswith("ETA 97s")
    progress(20.0)
    assert lines[-1] == "rb/cpu/p/default:    20s step 3/100, 1,000 tok/s (global), no new step for 17s"


def test_the_progress_line_says_no_step_came_before_a_short_stall_allowance_ends(tmp_path):
    """With stall_s 10 the line read 'ETA 1s' at step 11 of 30 until the harness killed the run:
    the quiet it waited for (10 s) was the whole allowance."""
    csv = tmp_path / "training.csv"
    point = SimpleNamespace(test_id="rb/cpu/p/default", phase=SimpleNamespace(steps=30, kind="train", stall_after_s=10.0))
    lines: list[str] = []
    progress = StepProgress(point, csv, lines.append)
    for step, elapsed in ((1, 0.3), (2, 0.6), (3, 0.9)):
        csv.write_text(HEADER + "".join(f"{s},5.0,0.1,1000,0.3,1,0,0\n" for s in range(1, step + 1)))
        progress(elapsed)
    progress(7.0)
    assert lines[-1] == "rb/cpu/p/default:     7s step 3/30, 1,000 tok/s (global), no new step for 6s"


def test_each_process_of_a_resume_point_is_named_in_its_progress_line_with_its_own_last_step(tmp_path):
    """A resume point's three processes each started again at 0 s under the point's name alone,
    the first half's line counting towards the point's last step, not its own."""
    csv = tmp_path / "training.csv"
    point = SimpleNamespace(test_id="rb/cpu/resume/default", phase=SimpleNamespace(steps=20, kind="train",
                                                                                   stall_after_s=300.0))
    first = legs(SimpleNamespace(resume_after=10, steps=20))[1]
    lines: list[str] = []
    progress = StepProgress(point, csv, lines.append, leg=first)
    for step, elapsed in ((1, 1.0), (2, 2.0)):
        csv.write_text(HEADER + "".join(f"{s},5.0,0.1,1000,1.0,1,0,0\n" for s in range(1, step + 1)))
        progress(elapsed)
    assert lines[-1] == ("rb/cpu/resume/default (first half (steps 1-10, stopped)):     2s step 2/10, "
                         "1,000 tok/s (global), ETA 8s")


def test_a_trainer_resumed_in_place_makes_progress_while_it_writes_steps_again(tmp_path):
    """A trainer that went back to its checkpoint at step 6 after step 10 writes steps 7-10 again:
    each is progress, though none is above the highest step seen (a restart that re-ran more steps
    than stall_s allows was once stopped as a stall)."""
    csv = tmp_path / "training.csv"
    beats = tmp_path / "heartbeat_rank0.jsonl"
    csv.write_text(HEADER + "".join(f"{s},5,0.1,10,0.1,1,0,0\n" for s in range(1, 11)))
    beats.write_text("".join(_beat(s) for s in range(1, 11)))
    watch = StepWatch(tmp_path, csv)
    assert watch.look() and watch.highest == 10
    assert not watch.look()
    for step in (7, 8):
        with open(beats, "a") as fh:
            fh.write(_beat(step))
        assert watch.look(), step
        with open(beats, "a") as fh:
            fh.write(_beat(step, stage="backward"))  # another stage of the step: none
        assert not watch.look()
    with open(csv, "a") as fh:
        fh.write("7,5,0.1,10,0.1,1,0,0\n")  # the CSV goes back too
    assert watch.look() and watch.highest == 10


def _write(path, *records) -> None:
    with open(path, "a") as fh:
        fh.writelines(json.dumps({"time": 1.0, "rank": int(path.stem[len("heartbeat_rank"):]), "step": s,
                                  "stage": stage, **extra}) + "\n" for s, stage, extra in records)


class Ranks:
    """A StepWatch over heartbeat files the test writes, each record read at a time of the test's
    (the seconds a rank stays silent are the test's, not the machine's)."""

    def __init__(self, tmp_path, world: int = 2):
        self.dir, self.watch, self.now = tmp_path, StepWatch(tmp_path, tmp_path / "training.csv"), 0.0
        self.files = [tmp_path / f"heartbeat_rank{r}.jsonl" for r in range(world)]

    def at(self, t: float, rank: int, *steps, stage: str = "optimizer", **extra) -> Ranks:
        """``rank`` writes a record of each of ``steps`` at ``t`` seconds, read then."""
        _write(self.files[rank], *((s, stage, extra) for s in steps))
        self.now = t
        self.watch.look(t)
        return self

    def silent(self, t: float, stall_s: float = 10.0, last_step: int | None = None, gone=()):
        return self.watch.silent(t, stall_s, last_step, gone)


def test_a_rank_silent_for_stall_s_while_another_goes_past_it_is_left_behind(tmp_path):
    """A user's pass: rank 1 hung within step 3 while rank 0, not waiting for it, kept stepping; the
    run's highest step kept growing, and the watch saw no stall. Per rank: rank 1's heartbeats showed
    no new step for stall_s while rank 0's went past it."""
    ranks = Ranks(tmp_path).at(0, 0, 1, 2).at(0, 1, 1, 2).at(1, 1, 3, stage="forward")
    for t in range(1, 9):
        ranks.at(t, 0, 2 + t)
    assert ranks.silent(10.9) == []  # 9.9 s: within stall_s
    [s] = ranks.silent(11.0)
    assert (s.rank, s.step, s.silent_s, s.others, s.left_behind) == (1, 3, 10.0, {0: 10}, True)
    assert s.text() == ("rank 1 hung at step 3: its heartbeats showed no new step for 10s while rank 0 went on to "
                        "step 10")


def test_ranks_that_lag_or_beat_every_few_steps_are_not_left_behind(tmp_path):
    """A slow rank that shows its next step within stall_s is never silent, however far behind; one
    that beats every 5 steps is left behind only once another went more than 5 steps past its last
    record (one waiting for it in a collective begins the step it hung in, step 16 at most)."""
    slow = Ranks(tmp_path / "slow")
    (tmp_path / "slow").mkdir()
    for t in range(0, 60, 5):
        slow.at(t, 1, 1 + t // 5)
        slow.at(t, 0, *range(1 + t * 4, 5 + t * 4))
    assert slow.silent(64.9) == []
    (tmp_path / "every").mkdir()
    every = Ranks(tmp_path / "every").at(0, 1, 1, 6, 11).at(0, 0, *range(1, 12))
    every.at(5, 0, *range(12, 16))
    [s] = every.silent(12)
    assert (s.step, s.others, s.left_behind) == (11, {0: 15}, False)  # rank 1's step 16 may come yet
    every.at(6, 0, 16)
    assert not every.silent(12)[0].left_behind
    every.at(7, 0, 17)
    assert every.silent(12)[0].left_behind


def test_a_finished_rank_a_halted_rank_and_a_rank_whose_process_ended_are_not_silent(tmp_path):
    """A rank at the run's last step finished; a halt record says the rank stopped with the run; a
    rank whose process the harness saw end left (its heartbeats and process are judged by
    judge/short_ranks.py)."""
    ranks = Ranks(tmp_path, world=4).at(0, 1, *range(1, 11)).at(0, 2, 1, 2).at(0, 2, 3, stage="halt")
    ranks.at(0, 3, 1, 2, pid=4242)
    for t in range(1, 20):
        ranks.at(t, 0, t)
    assert [s.rank for s in ranks.silent(21, last_step=None)] == [1, 3]
    assert [s.rank for s in ranks.silent(21, last_step=10)] == [3]
    assert ranks.silent(21, last_step=10, gone={4242}) == []
    ranks.at(21, 2, 3)  # a record after its halt record: it runs on, and is silent from its last new step
    assert [s.rank for s in ranks.silent(21, last_step=10, gone={4242})] == [2]


def test_a_lone_heartbeat_file_and_ranks_that_all_stop_are_no_silent_rank(tmp_path):
    """Only rank 0 writes heartbeats (the contract asks every rank, a trainer may not): nothing to
    compare. Every rank silent is the run's own stall, no rank's."""
    alone = Ranks(tmp_path, world=1)
    for t in range(30):
        alone.at(t, 0, t + 1)
    assert alone.silent(100) == []
    (tmp_path / "both").mkdir()
    both = Ranks(tmp_path / "both").at(0, 0, 1, 2, 3).at(1, 1, 1, 2, 3)
    assert both.silent(100) == []


def test_a_resume_in_place_rewriting_steps_is_progress_of_each_rank(tmp_path):
    """A trainer resumed in place writes the steps after its checkpoint again: each rank's records
    below its highest are its progress, and its silence counts from them."""
    ranks = Ranks(tmp_path).at(0, 0, *range(1, 11)).at(0, 1, *range(1, 11))
    ranks.at(8, 0, 6, 7, 8, 9, 10, 11, 12).at(9, 1, 6)
    assert ranks.silent(15) == []  # rank 1 wrote step 6 again at 9 s: silent 6 s, not 15
    ranks.at(10, 0, 13)
    [s] = ranks.silent(19.5)
    assert (s.rank, s.step, s.silent_s, s.others, s.left_behind) == (1, 6, 10.5, {0: 13}, True)


def test_a_rank_silent_within_its_first_step_is_silent_but_not_left_behind(tmp_path):
    """Start-up (its first step, a compilation) is no step of its own done: the watch does not stop the
    run for it, and a timeout that comes finds it silent (the finding names it hung)."""
    ranks = Ranks(tmp_path).at(0, 1, 1, stage="forward")
    for t in range(1, 15):
        ranks.at(t, 0, t)
    [s] = ranks.silent(15)
    assert (s.rank, s.step, s.silent_s, s.others[0], s.left_behind) == (1, 1, 15.0, 14, False)
