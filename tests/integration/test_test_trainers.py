"""The test trainers of tests/trainers (native, seed-like, minimal), run as a harness runs them,
under python and under torchrun with 2 gloo ranks: each TEST_TRAINER_FAULT kind does what
trainer_faults.py and the trainer's docstring say, so that a harness's fault matrix over them
tests the harness and not the trainers. Every process started here is killed by its id (a hung
trainer and, under torchrun, its agent's workers) before the test ends."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import yaml

TRAINERS = Path(__file__).resolve().parents[1] / "trainers"
STEPS = 8
EVERY = 2  # the seed-like and minimal trainers' logging interval: rows are not every step
# the trainers' own module (tests/trainers is their root, not a package of this repository)
_spec = importlib.util.spec_from_file_location("trainer_faults", TRAINERS / "trainer_faults.py")
faults = sys.modules.setdefault("trainer_faults", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(faults)


@dataclass(frozen=True)
class Trainer:
    name: str
    launch: Callable[[Path, int], tuple[list[str], dict[str, str]]]
    """(arguments after ``python``/``torchrun ...``, environment) for an out_dir and steps"""
    nonfinite_exit: int
    """its exit code on a non-finite loss (the seed's format stops with 0)"""
    beat_every: int = 1
    """its heartbeats' step interval (the minimal trainer beats on logged steps only)"""

    def last_beat_before(self, step: int) -> int:
        return (step - 1) // self.beat_every * self.beat_every


def _native(out: Path, steps: int):
    return ["native_train.py", "--steps", str(steps), "--out-dir", str(out)], {}


def _seedlike(out: Path, steps: int):
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump({"train": {"steps": 200, "seq_len": 64, "log_every": EVERY, "out_dir": str(out)}}))
    return ["seedlike_train.py", "--steps", str(steps)], {"CONFIG": str(config), "NSA_HEARTBEAT_EVERY": "1"}


def _minimal(out: Path, steps: int):
    return ["minimal_train.py"], {"MINIMAL_STEPS": str(steps), "MINIMAL_OUT_DIR": str(out),
                                  "MINIMAL_LOG_EVERY": str(EVERY)}


NATIVE, SEEDLIKE = Trainer("native", _native, 4), Trainer("seedlike", _seedlike, 0)
MINIMAL = Trainer("minimal", _minimal, 4, beat_every=EVERY)
ALL = [pytest.param(t, id=t.name) for t in (NATIVE, SEEDLIKE, MINIMAL)]


# --- running them --------------------------------------------------------------------------------


@dataclass
class Outcome:
    out: Path
    rc: int | None
    """None: still running when it was killed (a hang)"""
    stderr: str

    def rows(self) -> list[list[str]]:
        """training.csv's rows, as text (no header: the seed's format has none)."""
        lines = (self.out / "training.csv").read_text().splitlines()
        return [line.split(",") for line in lines if line and line[0].isdigit()]

    def steps_logged(self) -> list[int]:
        return [int(r[0]) for r in self.rows()]

    def beats(self, rank: int = 0) -> list[dict]:
        path = self.out / f"heartbeat_rank{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def top_beat(self, rank: int = 0) -> int:
        return max((b["step"] for b in self.beats(rank)), default=0)

    def env(self) -> dict:
        return json.loads((self.out / "env.json").read_text())


def _environment(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV and not k.startswith("NSA_")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def _argv(args: list[str], nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]


def _descendants(pid: int) -> list[int]:
    """pid's child processes, their children and so on (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except (OSError, ValueError):
            continue
        if d.name.isdigit():
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and every descendant, by id (torchrun's workers may sit in sessions
    of their own), and check that none of them is left."""
    tree = [proc.pid, *_descendants(proc.pid)]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while [pid for pid in tree if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in tree if _alive(pid)], "a process of the run survived"


def _sizes(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in out.iterdir()}


def run(trainer: Trainer, tmp_path: Path, fault: str = "", nproc: int = 1, steps: int = STEPS,
        hangs_after: Callable[[Outcome], bool] | None = None) -> Outcome:
    """Run a trainer to its end (60 s at most); with ``hangs_after``, wait until that holds of
    its files, check that the run then makes no more progress and is still alive, and kill it."""
    out = tmp_path / f"{trainer.name}_{nproc}"
    out.mkdir(parents=True)
    args, env = trainer.launch(out, steps)
    proc = subprocess.Popen(_argv(args, nproc), cwd=TRAINERS, env=_environment({**env, faults.ENV: fault}),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    outcome = Outcome(out, None, "")
    try:
        if hangs_after is None:
            _, outcome.stderr = proc.communicate(timeout=60)
            outcome.rc = proc.returncode
            return outcome
        deadline = time.monotonic() + 60
        while not hangs_after(outcome):
            assert proc.poll() is None, f"{trainer.name} exited {proc.returncode} instead of hanging"
            assert time.monotonic() < deadline, f"{trainer.name} never reached the hang"
            time.sleep(0.1)
        time.sleep(1.0)  # its last writes (a step is ~10 ms) are done by now
        before = _sizes(out)
        time.sleep(1.5)
        assert proc.poll() is None, f"{trainer.name} exited {proc.returncode} instead of hanging"
        assert _sizes(out) == before, "the run went on writing after the hang"
        return outcome
    finally:
        if proc.poll() is None:
            _kill_tree(proc)
            outcome.stderr = proc.stderr.read()


# --- the grammar ---------------------------------------------------------------------------------


def test_the_fault_grammar():
    P = faults.parse
    assert P("", 1) == faults.Fault()
    assert P("quit_early", 1) == faults.Fault("quit_early", None, faults.DEFAULT_STEP)
    assert P("hang_rank:1@7", 2) == faults.Fault("hang_rank", 1, 7)
    assert P(" nan@2 ", 1) == faults.Fault("nan", None, 2)
    f = P("hang_rank:1@7", 2)
    assert f.hangs(1, 7) and not f.hangs(0, 7) and f.peer_hangs(0, 7) and not f.peer_hangs(1, 7)
    assert not f.hangs(1, 6) and P("hang_all@2", 4).hangs(3, 2) and not P("hang_all@2", 4).peer_hangs(3, 2)
    k = P("kill_rank:1@2", 2)
    assert k.kills(1, 2) and not k.kills(0, 2) and not k.kills(1, 3) and not k.hangs(1, 2)
    t = P("term_rank:1@2", 2)
    assert t.terms(1, 2) and not t.terms(0, 2) and not t.terms(1, 3) and not t.kills(1, 2) and not t.peer_hangs(0, 2)
    q = P("quit_in_step:1@8", 2)
    assert q.quits_in_step(1, 8) and not q.quits_in_step(0, 8) and not q.quits_in_step(1, 7) and not q.quits(1, 8)
    assert q.peer_hangs(0, 8) and not q.peer_hangs(1, 8) and not q.peer_hangs(0, 7)
    slow = P("slow_rank:0@2", 2)
    assert slow.slows(0, 2) and slow.slows(0, 9) and not slow.slows(0, 1) and not slow.slows(1, 2)
    for bad, why in [("explode", "KIND"), ("hang_rank", "hang_rank:R"), ("nan:1", "only with them"),
                     ("kill_rank", "kill_rank:R"), ("term_rank", "term_rank:R"), ("quit_in_step@3", "quit_in_step:R"),
                     ("slow_rank:2", "rank 2 does not exist"),
                     ("hang_rank:2", "rank 2 does not exist"), ("missing_optional@3", "no step"),
                     ("crash@0", "from 1"), ("crash@x", "KIND")]:
        with pytest.raises(ValueError, match=why):
            P(bad, 2)


@pytest.mark.parametrize("trainer", ALL)
def test_a_bad_spec_is_exit_2_before_anything_is_written(tmp_path, trainer):
    for spec in ("explode", "hang_rank:1"):
        o = run(trainer, tmp_path / spec, spec)
        assert o.rc == 2 and f"{faults.ENV}={spec!r}" in o.stderr, o.stderr
        assert not (o.out / "training.csv").exists()


# --- every fault, one process --------------------------------------------------------------------


@pytest.mark.parametrize("trainer", ALL)
def test_a_clean_run_and_missing_optional(tmp_path, trainer):
    clean = run(trainer, tmp_path / "clean", "")
    assert clean.rc == 0, clean.stderr
    assert clean.steps_logged()[-1] == STEPS and clean.top_beat() == STEPS
    assert not (clean.out / ".HALT").exists()
    bare = run(trainer, tmp_path / "bare", "missing_optional")
    assert bare.rc == 0 and bare.steps_logged() == clean.steps_logged()
    assert not set(faults.OPTIONAL_ENV_KEYS) & set(bare.env())
    if trainer is not SEEDLIKE:  # the seed's env.json never has them; the native ones do, unless told
        assert set(faults.OPTIONAL_ENV_KEYS) <= set(clean.env())
        assert clean.env()["world_size"] == bare.env()["world_size"] == 1
        assert clean.env()["contract_version"] == 2


@pytest.mark.parametrize("trainer", ALL)
def test_quit_early_exits_0_after_its_step_without_halt(tmp_path, trainer):
    o = run(trainer, tmp_path, "quit_early@4")
    assert o.rc == 0, o.stderr
    assert o.steps_logged()[-1] == 4 and o.top_beat() == 4
    assert not (o.out / ".HALT").exists()


@pytest.mark.parametrize("fault", ["hang_rank:0@4", "hang_all@4"])
@pytest.mark.parametrize("trainer", ALL)
def test_a_hung_process_writes_nothing_after_the_step_before(tmp_path, trainer, fault):
    before = trainer.last_beat_before(4)
    o = run(trainer, tmp_path, fault, hangs_after=lambda o: o.top_beat() >= before)
    assert o.top_beat() == before and o.steps_logged()[-1] <= 3


@pytest.mark.parametrize("trainer", ALL)
def test_kill_rank_is_a_sigkill_as_its_step_starts(tmp_path, trainer):
    o = run(trainer, tmp_path, "kill_rank:0@4")
    assert o.rc == -signal.SIGKILL and "injected" not in o.stderr, o.stderr
    assert o.top_beat() == trainer.last_beat_before(4)


@pytest.mark.parametrize("trainer", ALL)
def test_term_rank_is_a_sigterm_as_its_step_starts(tmp_path, trainer):
    o = run(trainer, tmp_path, "term_rank:0@4")
    # the seed's handler dumps its stacks and exits 128 + 15; the others die of the signal
    assert o.rc == (128 + signal.SIGTERM if trainer is SEEDLIKE else -signal.SIGTERM), (o.rc, o.stderr)
    assert o.top_beat() == trainer.last_beat_before(4)


@pytest.mark.parametrize("trainer", ALL)
def test_slow_rank_spends_slow_s_more_on_each_step_from_its_step(tmp_path, trainer):
    o = run(trainer, tmp_path, "slow_rank:0@3", steps=5)
    assert o.rc == 0, o.stderr
    times = [b.get("time", b.get("ts")) for b in o.beats()]  # steps 3, 4 and 5 lie between the first and last
    assert o.top_beat() == 5 and times[-1] - times[0] >= 3 * faults.SLOW_S, times


@pytest.mark.parametrize("trainer", ALL)
def test_nan_is_logged_then_the_trainers_own_halt(tmp_path, trainer):
    o = run(trainer, tmp_path, "nan@4")
    assert o.rc == trainer.nonfinite_exit, o.stderr
    assert o.steps_logged()[-1] == 4 and o.rows()[-1][1].lower() == "nan"
    halt = (o.out / ".HALT").read_text()
    if trainer is SEEDLIKE:
        assert halt == "halt: nan_loss\n" and (o.out / ".anomaly_type").read_text() == "nan_loss\n"
    else:
        rec = json.loads(halt)
        assert rec["source"] == "nonfinite" and rec["step"] == 4


@pytest.mark.parametrize("trainer", ALL)
def test_crash_is_a_traceback_and_exit_1(tmp_path, trainer):
    o = run(trainer, tmp_path, "crash@4")
    assert o.rc == 1 and "RuntimeError: injected crash" in o.stderr, o.stderr
    assert o.steps_logged()[-1] <= 3 and o.top_beat() <= 4


@pytest.mark.parametrize("trainer", ALL)
def test_malformed_writes_a_non_number_and_goes_on(tmp_path, trainer):
    o = run(trainer, tmp_path, "malformed@3")
    assert o.rc == 0, o.stderr
    bad = [r for r in o.rows() if r[0] == "3"]
    assert len(bad) == 1 and bad[0][1] == faults.MALFORMED_CELL
    assert o.steps_logged()[-1] == STEPS


# --- under torchrun, 2 gloo ranks ----------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.parametrize("trainer", ALL)
def test_torchrun_clean_then_rank_1_hangs_and_rank_0_stops_with_it(tmp_path, trainer):
    clean = run(trainer, tmp_path / "clean", nproc=2)
    assert clean.rc == 0, clean.stderr
    assert clean.top_beat(0) == clean.top_beat(1) == STEPS and clean.steps_logged()[-1] == STEPS
    if trainer is not SEEDLIKE:
        assert clean.env()["world_size"] == 2

    before = trainer.last_beat_before(4)
    hung = run(trainer, tmp_path / "hung", "hang_rank:1@4", nproc=2,
               hangs_after=lambda o: min(o.top_beat(0), o.top_beat(1)) >= before)
    assert hung.top_beat(1) == before  # rank 1 wrote nothing of step 4
    assert hung.steps_logged()[-1] <= 3  # and rank 0 completed no step 4 either
    rank0_step4 = [b.get("stage") or b.get("msg") for b in hung.beats(0) if b["step"] == 4]
    if trainer is NATIVE:  # rank 0 began step 4 and is blocked in its all-reduce
        assert rank0_step4 == ["forward"]
    elif trainer is SEEDLIKE:  # rank 0 beat step 4, then waits as its DDP would
        assert rank0_step4 == ["beat"]
    else:
        assert rank0_step4 == []


@pytest.mark.distributed
def test_torchrun_native_all_ranks_hang_and_nan_halts_every_rank(tmp_path):
    hung = run(NATIVE, tmp_path / "hang", "hang_all@4", nproc=2,
               hangs_after=lambda o: min(o.top_beat(0), o.top_beat(1)) >= 3)
    assert hung.top_beat(0) == hung.top_beat(1) == 3
    nan = run(NATIVE, tmp_path / "nan", "nan@4", nproc=2)
    assert nan.rc != 0 and "exitcode  : 4" in nan.stderr, nan.stderr  # torchrun's summary of the ranks
    assert json.loads((nan.out / ".HALT").read_text())["source"] == "nonfinite"
    assert all(nan.beats(r)[-1]["stage"] == "halt" for r in (0, 1))
