"""The fault matrix over four trainers: this project's (`python -m nsa.train`) and three outside
the nsa package in tests/trainers/ (native_train.py writes the contract itself, seedlike_train.py
writes the seed system's format read through its adapter, minimal_train.py writes the contract by
environment variables and a row every few steps), each under python and under torchrun with two
gloo ranks, each fault of a trainer that goes wrong: it quits early, one rank hangs, every rank
hangs, the loss goes NaN, it crashes, it writes a malformed row, it leaves out the contract's
optional keys.

Every cell must give the right verdict naming the right rank, report a hang within stall_s +
10 s of the last progress, leave no process of the run behind (the test looks) and leave the
earlier run's record and artifacts intact. The rows go into docs/reliability.md.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.faults import _util as U
from validation.judge.findings import find
from validation.judge.record import PhaseRecord, Status
from validation.runbook.load import load_profile, load_runbook
from validation.runbook.plan import expand
from validation.session.session import AcceptanceSession, SessionOptions

STEPS = 8
FAULT_STEP = 3
STALL_S = 8.0
#: generous: a loaded 2-core box imports torch for every rank of this project's trainer
STARTUP_S = 120.0
REPORT_SLACK_S = 10.0
TEST_FAULT = "TEST_TRAINER_FAULT"


@dataclass(frozen=True)
class Trainer:
    name: str
    entry: dict[str, Any] | None
    """The runbook's trainer: entry (None: this project's own, python -m nsa.train)."""
    phase_extra: dict[str, Any]


OWN = Trainer("nsa.train", None, {"config": "tiny", "overrides": {**U.TINY, "watchdog.enabled": False}})
TRAINERS = [
    OWN,
    Trainer("native", {"name": "native", "root": "tests/trainers", "script": "native_train.py",
                       "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]}, {}),
    Trainer("seedlike", {"name": "seedlike", "root": "tests/trainers", "script": "seedlike_train.py",
                         "args": ["--dataset", "synthetic"],
                         "config": {"template": "configs/seedlike.yaml", "pass_as": {"env": "CONFIG"}},
                         "steps": {"flag": "--steps"}, "out_dir": {"config": "train.out_dir"},
                         "params": {"train.log_every": {"config": "train.log_every"}},
                         "env": {"NSA_HEARTBEAT_EVERY": 1}, "format": "seed"},
            {"overrides": {"train.log_every": 1}}),
    Trainer("minimal", {"name": "minimal", "root": "tests/trainers", "script": "minimal_train.py",
                        "steps": {"env": "MINIMAL_STEPS"}, "out_dir": {"env": "MINIMAL_OUT_DIR"},
                        "env": {"MINIMAL_LOG_EVERY": 2}}, {}),
]
FAULTS = ("quit_early", "hang_one", "hang_all", "nan", "crash", "malformed", "missing_optional")
LAUNCHERS = ("python", "torchrun")


def _hung_rank(launcher: str) -> int:
    return 1 if launcher == "torchrun" else 0


def _injection(trainer: Trainer, fault: str, launcher: str) -> tuple[dict[str, str], str]:
    """(the phase's env for this project's trainer, the harness's TEST_TRAINER_FAULT for the others)."""
    r = _hung_rank(launcher)
    if trainer is OWN:
        spec = {"quit_early": f"quit_early:step={FAULT_STEP}", "hang_one": f"stall:rank={r}:step={FAULT_STEP}",
                "hang_all": f"stall:step={FAULT_STEP}", "nan": f"nan:rank=0:step={FAULT_STEP}",
                "crash": f"crash:rank={r}:step={FAULT_STEP}", "malformed": f"malformed:step={FAULT_STEP}",
                "missing_optional": "missing_optional"}[fault]
        return {"NSA_FAULT": spec}, ""
    spec = {"quit_early": f"quit_early@{FAULT_STEP}", "hang_one": f"hang_rank:{r}@{FAULT_STEP}",
            "hang_all": f"hang_all@{FAULT_STEP}", "nan": f"nan@{FAULT_STEP}", "crash": f"crash@{FAULT_STEP}",
            "malformed": f"malformed@{FAULT_STEP}", "missing_optional": "missing_optional"}[fault]
    return {}, spec


def _point(root: Path, trainer: Trainer, fault: str, launcher: str, env: dict[str, str]):
    gates = [{"metric": "loss_finite", "op": "==", "threshold": 1}]
    if fault == "missing_optional":
        gates.append({"metric": "backends_recorded", "op": "==", "threshold": 1})
    phase = {"name": fault, "kind": "train", "steps": STEPS, "timeout_s": 240, "stall_s": STALL_S,
             "startup_s": STARTUP_S, "gates": gates, "env": {"OMP_NUM_THREADS": 1, **env}}
    extra = json.loads(json.dumps(trainer.phase_extra))
    if launcher == "torchrun":
        phase["launcher"] = {"kind": "torchrun", "nproc": 2}
        if trainer is OWN:
            extra["overrides"] = {**extra["overrides"], "dist.mode": "ddp"}
    phase.update(extra)
    data: dict[str, Any] = {"name": f"matrix_{trainer.name.replace('.', '_')}_{launcher}", "profiles": ["cpu"],
                            "phases": [phase]}
    if trainer.entry is not None:
        data["trainer"] = trainer.entry
    path = root / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    (point,) = expand(load_runbook(path), load_profile("cpu"))
    return point


def _alive_with(marker: str) -> list[int]:
    """Live processes whose command line or environment mention ``marker`` (a test's own tmp
    directory: the seed format passes its directory through CONFIG, not the command line)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            text = " ".join(p.info["cmdline"] or []) + " " + " ".join((p.info["environ"] or {}).values())
        except (psutil.Error, TypeError):
            continue
        if marker in text:
            out.append(p.info["pid"])
    return out


def _last_progress(run_dir: Path) -> float:
    """The time of the newest heartbeat record any rank wrote."""
    times = []
    for beat in run_dir.rglob("heartbeat_rank*.jsonl"):
        for line in beat.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            t = rec.get("time", rec.get("ts"))
            if isinstance(t, (int, float)):
                times.append(float(t))
    return max(times)


def _finding(rec: PhaseRecord, kind: str) -> str:
    found = [f for f in find([rec]) if f.kind.startswith(kind)]
    assert found, f"no {kind} finding: {[f.title for f in find([rec])]}"
    return found[0].title + "\n" + "\n".join(found[0].detail)


def _expect(fault: str, launcher: str) -> str:
    r = _hung_rank(launcher)
    return {"quit_early": f"FAIL: stopped after step {FAULT_STEP} of {STEPS}, exit 0, no .HALT",
            "hang_one": f"FAIL 'stalled' within stall_s + {REPORT_SLACK_S:g} s, the finding naming rank {r}",
            "hang_all": f"FAIL 'stalled' within stall_s + {REPORT_SLACK_S:g} s, a stack of every rank",
            "nan": f"FAIL: non-finite loss at step {FAULT_STEP}",
            "crash": "FAIL with the crash finding and its exception",
            "malformed": f"ERROR naming training.csv, the row of step {FAULT_STEP} and its column",
            "missing_optional": "UNMEASURED (backends_recorded), never FAIL"}[fault]


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("trainer", TRAINERS, ids=[t.name for t in TRAINERS])
def test_fault_matrix(trainer, fault, launcher, seeded, matrix, monkeypatch):
    env, switch = _injection(trainer, fault, launcher)
    how = ", ".join([*(f"`{k}={v}`" for k, v in env.items()), *([f"`{TEST_FAULT}={switch}`"] if switch else [])])
    matrix.start(f"{trainer.name} x {launcher}: {fault}", f"{how}, {'torchrun x2 (gloo)' if launcher == 'torchrun' else 'python'}",
                 _expect(fault, launcher))
    if switch:  # a runbook may not set it (the harness's allow-list of variables): the harness's own environment
        monkeypatch.setenv(TEST_FAULT, switch)
    else:
        monkeypatch.delenv(TEST_FAULT, raising=False)
    point = _point(seeded.root, trainer, fault, launcher, env)
    t0 = time.time()
    rec = AcceptanceSession(SessionOptions(seeded.results)).run_point(point)
    ended = time.time()
    run_dir = seeded.results / rec.out_dir
    elapsed, bound, said = ended - t0, None, rec.reason
    if fault == "quit_early":
        assert rec.status == Status.FAIL and f"stopped after step {FAULT_STEP} of {STEPS}" in rec.reason, rec.reason
        said += " | " + _finding(rec, "short_run").splitlines()[0]
    elif fault in ("hang_one", "hang_all"):
        assert rec.status == Status.FAIL and rec.reason.startswith("stalled"), rec.reason
        elapsed, bound = ended - _last_progress(run_dir), STALL_S + REPORT_SLACK_S
        assert elapsed <= bound, f"the hang was reported {elapsed:.1f}s after the last progress"
        text = _finding(rec, "stall")
        ranked = {t.rank for t in rec.evidence.taken_stacks if t.rank is not None}
        world = 2 if launcher == "torchrun" else 1
        if fault == "hang_one":
            assert f"rank {_hung_rank(launcher)} in hang_forever" in text or \
                f"rank {_hung_rank(launcher)} in FaultInjector.at" in text, text
        else:
            assert ranked == set(range(world)), (ranked, text)
        said += " | " + text.splitlines()[0]
    elif fault == "nan":
        assert rec.status == Status.FAIL and f"non-finite loss at step {FAULT_STEP}" in rec.reason, rec.reason
    elif fault == "crash":
        assert rec.status == Status.FAIL, rec.reason
        text = _finding(rec, "crash")
        if launcher == "torchrun" and trainer is OWN:
            assert f"rank {_hung_rank(launcher)}" in text, text
        said += " | " + text.splitlines()[0]
    elif fault == "malformed":
        assert rec.status == Status.ERROR and "training.csv" in rec.reason and f"(step {FAULT_STEP}), column " in rec.reason, rec.reason
    else:
        assert rec.status == Status.UNMEASURED, (rec.status, rec.reason)
        assert "backends_recorded" in rec.reason, rec.reason
    marker = str(seeded.root)
    deadline = time.monotonic() + 10
    while _alive_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive_with(marker), f"processes of the run left behind: {_alive_with(marker)}"
    seeded.intact()
    matrix.done(str(rec.status), said, elapsed, bound)
