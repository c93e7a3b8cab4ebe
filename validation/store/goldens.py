"""Golden loss curves: the per-step loss of the first N steps of a deterministic phase point,
kept per (runbook, profile, point, hardware class) in a small versioned YAML file beside the
runbooks, ``runbooks/goldens/<runbook>__<profile>.yaml``.

A phase opts in with ``golden_steps: N`` (synthetic data, fixed seed); the profile sets the
tolerance, ``golden_loss_rtol`` (tight on CPU, looser on GPU where kernels may accumulate in a
different order; null = to be measured). A run of such a point gets one more gate,
``golden_loss_rel_diff <= golden_loss_rtol``: the largest relative difference from the golden over
steps 1..N, with the first step beyond the tolerance named in the gate's note. Goldens are
written only by ``nsa-validate bless`` (``bless`` below), never by a run; it replaces only the
curves it is asked for. A golden point that also has ``repeats: K`` (K >= 2) gets
``repeat_loss_rel_diff <= golden_loss_rtol`` as well (``repeat_gate``): its K runs of one commit
against each other, which tells a trainer whose numbers changed since the golden's commit (the
runs agree, the golden differs) from one that does not repeat itself (the runs differ).

The file says its schema: 1 is read and written; another schema, or a file that is not a golden
file of this runbook and profile, is an error naming the file (as the result store does).
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import yaml

from nsa.atomic import write_atomic
from nsa.yaml_unique import safe_load_unique
from validation.contract.files import read_training_csv
from validation import DEFAULT_RESULTS_DIR
from validation.errors import ArtifactError, HarnessError
from validation.judge.gates import GOLDEN_METRIC, REPEAT_LOSS_METRIC, GateResult, GateVerdict, Pending, check
from validation.machine import Machine
from validation.runbook.plan import GOLDEN_RTOL as RTOL_KEY
from validation.runbook.plan import PhasePoint
from validation.store.lock import exclusive

if TYPE_CHECKING:
    # types only: pandas is imported where a frame is made (validation/contract/files.py says why)
    import pandas as pd

SCHEMA = 1
METRIC = GOLDEN_METRIC
DESCRIPTION = "loss per step against the golden curve"
REPEAT_METRIC = REPEAT_LOSS_METRIC
REPEAT_DESCRIPTION = "loss per step of the point's repeats against each other (one commit, one seed)"


class GoldenError(HarnessError):
    """A golden file is unreadable, foreign or from a newer harness; or a bless cannot be done."""


def hardware_class(machine: Machine) -> str:
    """'cpu', or the GPU model as a lower-case slug ('nvidia_h100_80gb_hbm3'): losses are
    compared only between machines of one class."""
    if not machine.gpu_names:
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "_", sorted(set(machine.gpu_names))[0].lower()).strip("_")


def point_id(point: PhasePoint) -> str:
    """'phase/point' ('long_run/default'): the point's name inside its runbook and profile."""
    return f"{point.phase.name}/{point.slug}"


def _unordered(pid: str) -> tuple[str, tuple[str, ...]]:
    """'scaling_sweep/seq_len=32,batch_size=1' as its phase and its sweep's parts in any order."""
    phase, _, slug = pid.partition("/")
    return phase, tuple(sorted(slug.split(",")))


@dataclass(frozen=True)
class Curve:
    """The loss at steps 1..len(loss) of one point on one hardware class, and where it came from."""

    loss: tuple[float, ...]
    commit: str | None = None
    """The trainer's commit the curve was run at (this repository's for its own trainer)."""
    blessed: str = ""
    """When it was blessed (UTC, ISO 8601)."""
    torch: str | None = None
    run: str = ""
    """The run directory it was read from, relative to its results directory."""
    trainer: str | None = None
    """The trainer that ran (None in curves blessed before it was recorded)."""
    harness_commit: str | None = None
    """This repository's commit at the run, beside the trainer's."""

    def origin(self) -> str:
        """Where the curve came from ('commit <12 hex digits>, blessed YYYY-MM-DD HH:MM UTC from
        runs/<runbook>/<profile>/<phase>/<point>/<run id>'): a run's commit against this tells a
        change of the trainer's numerics from a run that does not repeat itself, and the time and
        run tell one curve of the file from another blessed over it."""
        return (f"commit {(self.commit or 'not recorded')[:12]}, blessed {_minute(self.blessed)}"
                + (f" from {self.run}" if self.run else ""))


def _minute(stamp: str) -> str:
    """'YYYY-MM-DD HH:MM UTC' of an ISO 8601 time ('YYYY-MM-DDTHH:MM:SS+00:00'); the text as it is
    where it is no such time, 'at an unrecorded date' where it is empty."""
    try:
        t = _dt.datetime.fromisoformat(stamp)
    except ValueError:
        return stamp or "at an unrecorded date"
    return (t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)).astimezone(_dt.timezone.utc).strftime(
        "%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class Divergence:
    """The first step whose loss is outside the tolerance."""

    step: int
    loss: float
    golden: float
    rel: float

    def text(self) -> str:
        return (f"first diverging step {self.step}: loss {self.loss:.6g} vs golden {self.golden:.6g} "
                f"(abs diff {abs(self.loss - self.golden):.3g}, rel {self.rel:.3g})")


@dataclass
class GoldenFile:
    path: Path
    runbook: str
    profile: str
    curves: dict[str, dict[str, Curve]] = field(default_factory=dict)
    """point id -> hardware class -> curve."""

    @classmethod
    def for_pair(cls, runbook_path: Path, runbook: str, profile: str) -> GoldenFile:
        """The golden file of a runbook and profile (goldens/ beside the runbook's YAML); empty
        when there is none yet. A folder on its way that cannot be searched is a GoldenError."""
        path = _path(runbook_path, runbook, profile)
        try:
            exists = path.exists()
        except OSError as exc:
            raise GoldenError.of_os("cannot read the golden file", path, exc) from None
        return cls.load(path, runbook, profile) if exists else cls(path, runbook, profile)

    @classmethod
    @contextlib.contextmanager
    def editing(cls, runbook_path: Path, runbook: str, profile: str) -> Iterator[GoldenFile]:
        """The pair's golden file, read under an exclusive lock (``.<file name>.lock`` beside it)
        and saved before the lock is released, unless the block raised: two blesses of one pair
        at once each add their curves to the file the other saved (without the lock the later one
        would write back the file as it read it, without the other's curves). A folder where the
        lock cannot be made is a GoldenError naming the file, as a failed save is."""
        path = _path(runbook_path, runbook, profile)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(exclusive(path.with_name(f".{path.name}.lock")))
            except OSError as exc:
                raise GoldenError.of_os("cannot write the golden file", path, exc) from None
            golden = cls.for_pair(runbook_path, runbook, profile)
            yield golden
            golden.save()

    @classmethod
    def load(cls, path: Path, runbook: str, profile: str) -> GoldenFile:
        try:
            data = safe_load_unique(path.read_text())
        except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
            raise GoldenError(f"{path}: not a readable golden file ({exc})") from None
        if not isinstance(data, dict) or not isinstance(data.get("points"), dict):
            raise GoldenError(f"{path}: not a golden loss file (no 'points' mapping); move it aside or re-bless")
        if data.get("schema") != SCHEMA:
            raise GoldenError(f"{path}: schema {data.get('schema')!r}; this harness reads golden schema {SCHEMA} "
                              "(a newer harness wrote it?)")
        if (data.get("runbook"), data.get("profile")) != (runbook, profile):
            raise GoldenError(f"{path}: holds goldens of runbook {data.get('runbook')!r}, profile "
                              f"{data.get('profile')!r}; expected {runbook!r}, {profile!r}")
        out = cls(path, runbook, profile)
        for pid, by_class in data["points"].items():
            if not isinstance(by_class, dict):
                raise GoldenError(f"{path}: points.{pid}: expected a mapping of hardware class -> curve")
            for hw, c in by_class.items():
                out.curves.setdefault(str(pid), {})[str(hw)] = _curve(path, f"points.{pid}.{hw}", c)
        return out

    def _held(self, pid: str) -> str:
        """The name this file holds ``pid``'s curves under: ``pid``, or the same point named with its
        sweep's keys in another order (a point is its values, not their order: stale.realign)."""
        if pid in self.curves:
            return pid
        same = [held for held in self.curves if _unordered(held) == _unordered(pid)]
        return same[0] if same else pid

    def get(self, pid: str, hw_class: str) -> Curve | None:
        return self.curves.get(self._held(pid), {}).get(hw_class)

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def lacks(self, pid: str, hw_class: str) -> str:
        """Why it holds no curve of ``pid`` on ``hw_class``, naming the exact path looked for: that
        it does not exist (a runbook copied elsewhere looks in goldens/ beside itself), or that it
        exists and has no curve of the point on that class (and the classes it has one on)."""
        if not self.exists:
            return f"{self.path} does not exist (golden files are looked for in goldens/ beside the runbook)"
        others = sorted(self.curves.get(self._held(pid), {}))
        return f"{self.path} exists but holds no such curve" + (f" (it has {pid} on {', '.join(others)})"
                                                                  if others else "")

    def put(self, pid: str, hw_class: str, curve: Curve) -> None:
        held = self._held(pid)
        if held != pid:  # the point's curves move to its name of now
            self.curves[pid] = self.curves.pop(held)
        self.curves.setdefault(pid, {})[hw_class] = curve

    def save(self) -> None:
        """Write atomically (nsa/atomic.py): the file is whole or as it was. One that cannot be
        written (a read-only folder, a full disk) is a GoldenError naming it and the system's reason."""
        data = {"schema": SCHEMA, "runbook": self.runbook, "profile": self.profile, "points": {
            pid: {hw: _curve_data(c) for hw, c in sorted(by_class.items())}
            for pid, by_class in sorted(self.curves.items())}}
        text = ("# Golden loss curves (validation/store/goldens.py). Written by `nsa-validate bless`; "
                "do not edit by hand.\n"
                + yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, text, mode=0o644)
        except OSError as exc:
            raise GoldenError.of_os("cannot write the golden file", self.path, exc) from None


def _path(runbook_path: Path, runbook: str, profile: str) -> Path:
    return Path(runbook_path).parent / "goldens" / f"{runbook}__{profile}.yaml"


def _curve_data(c: Curve) -> dict[str, Any]:
    data = {"loss": list(c.loss), "commit": c.commit, "blessed": c.blessed, "torch": c.torch, "run": c.run}
    if c.trainer is not None:  # curves blessed before these were recorded stay as they were
        data.update(trainer=c.trainer, harness_commit=c.harness_commit)
    return data


def _curve(path: Path, where: str, c: Any) -> Curve:
    loss = c.get("loss") if isinstance(c, dict) else None
    if not isinstance(loss, list) or not loss or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in loss):
        raise GoldenError(f"{path}: {where}.loss: expected a non-empty list of finite numbers")
    return Curve(tuple(float(v) for v in loss), c.get("commit"), str(c.get("blessed") or ""), c.get("torch"),
                 str(c.get("run") or ""), c.get("trainer"), c.get("harness_commit"))


def losses(csv: pd.DataFrame | None, steps: int) -> list[float | None]:
    """training.csv's loss at steps 1..steps (None where a step is not logged)."""
    by_step = {} if csv is None else dict(zip(csv["step"].astype(int), csv["loss"].astype(float)))
    return [by_step.get(s) for s in range(1, steps + 1)]


def compare(loss: list[float | None], golden: Curve, rtol: float) -> tuple[float | None, Divergence | None]:
    """The largest relative difference over the golden's steps (None when a step is missing or
    not finite) and the first step beyond ``rtol``."""
    worst, first = 0.0, None
    for step, (got, want) in enumerate(zip(loss, golden.loss), start=1):
        if got is None or got != got:
            return None, first
        rel = abs(got - want) / max(abs(want), 1e-12)
        worst = max(worst, rel)
        if first is None and rel > rtol:
            first = Divergence(step, got, want, rel)
    return worst, first


def bless_line(point: PhasePoint, results_dir: Path) -> str:
    """The command that blesses ``point``'s stored run in ``results_dir`` (named unless it is the
    default store: a line without it would bless another store's run of the point)."""
    store = Path(results_dir).resolve()
    at = "" if store == DEFAULT_RESULTS_DIR.resolve() else f" --results-dir {store}"
    return (f"nsa-validate bless --runbook {point.runbook.cli_name} --profile {point.profile.cli_name} "
            f"--point {point_id(point)}{at}")


def gate(point: PhasePoint, csv: pd.DataFrame | None, machine: Machine, results_dir: Path) -> GateResult | None:
    """The golden-loss gate of a point with ``golden_steps`` (None for other points): its loss at
    steps 1..golden_steps against the golden curve's (of at least as many steps; one of fewer, blessed
    when the point asked fewer, is no golden of these steps)."""
    steps = point.phase.golden_steps
    if not steps:
        return None
    rtol = point.profile.thresholds[RTOL_KEY]  # present: PhasePoint.gates checked it
    goldens = GoldenFile.for_pair(point.runbook.path, point.runbook.name, point.profile.name)
    hw = hardware_class(machine)
    pid = point_id(point)
    curve = goldens.get(pid, hw)
    where = f"steps 1-{steps}"
    if curve is None or len(curve.loss) < steps:
        lacks = (goldens.lacks(pid, hw) if curve is None else
                 f"the curve in {goldens.path} holds steps 1-{len(curve.loss)}, fewer than golden_steps {steps}")
        # the tolerance is the profile's (what is missing is the curve, not a threshold)
        return GateResult(METRIC, "<=", rtol, where, None, GateVerdict.UNMEASURED, RTOL_KEY, DESCRIPTION,
                          note=f"no golden for {pid} on {hw}: {lacks}; write one with "
                               f"`{bless_line(point, results_dir)}`",
                          pending=Pending.NO_GOLDEN)
    golden = dataclasses.replace(curve, loss=curve.loss[:steps])
    value, first = compare(losses(csv, steps), golden, rtol if rtol is not None else 0.0)
    if value is None:
        note = f"training.csv lacks a finite loss for one of steps 1-{steps}"
    elif first is not None:
        note = f"{first.text()}; the golden: {curve.origin()}"
    else:
        note = f"the golden on {hw}: {curve.origin()}"
    if rtol is None:
        note = f"tolerance to be measured (profile {RTOL_KEY}); " + note
    verdict = check(value, "<=", rtol)
    return GateResult(METRIC, "<=", rtol, where, value, verdict, RTOL_KEY, DESCRIPTION,
                      note=note, pending=Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None)


def repeat_gate(point: PhasePoint, csvs: list[pd.DataFrame | None]) -> GateResult | None:
    """The repeats of a golden point against each other over its golden steps (None for a point
    without golden_steps or with one run): the largest relative difference between any two."""
    steps = point.phase.golden_steps
    if not steps or len(csvs) < 2:
        return None
    rtol = point.profile.thresholds[RTOL_KEY]
    curves = [losses(csv, steps) for csv in csvs]
    where = f"steps 1-{steps}"
    if any(v is None or not math.isfinite(v) for c in curves for v in c):
        return GateResult(REPEAT_METRIC, "<=", rtol, where, None, GateVerdict.NO_DATA, RTOL_KEY, REPEAT_DESCRIPTION,
                          note=f"a repeat's training.csv lacks a finite loss for one of steps 1-{steps}")
    s = spread(curves)
    note = f"{len(csvs)} runs " + ("identical at every step" if s.first_step is None else
                                   f"first differ at step {s.first_step}, by up to {s.max_abs:.3g}")
    verdict = check(s.max_rel, "<=", rtol)
    return GateResult(REPEAT_METRIC, "<=", rtol, where, s.max_rel, verdict, RTOL_KEY, REPEAT_DESCRIPTION, note=note,
                      pending=Pending.THRESHOLD if verdict == GateVerdict.UNMEASURED else None)


@dataclass(frozen=True)
class Recheck:
    """A stored run's golden gate evaluated again at report time, against the golden file as it
    is now (a curve blessed, replaced or removed since the run)."""

    stored: GateResult
    now: GateResult | None
    """None when it could not be evaluated again (the run's training.csv is gone or unreadable)."""
    why_not: str = ""

    @property
    def changed(self) -> bool:
        return self.now is not None and (self.now.verdict, self.now.value) != (self.stored.verdict, self.stored.value)


def recheck(point: PhasePoint, stored: GateResult, results_dir: Path, run: str, machine: Machine) -> Recheck:
    """``stored`` (a record's golden gate) evaluated again from the run's own training.csv (``run``:
    its directory, relative to ``results_dir``). Where the verdict changed, the note names the golden
    file by its path, and says so where the curve was blessed from this very run (it matches itself)."""
    try:
        csv = read_training_csv(Path(results_dir) / run)
    except ArtifactError as exc:
        return Recheck(stored, None, str(exc))
    now = gate(point, csv, machine, results_dir)
    if now is not None and (now.verdict, now.value) != (stored.verdict, stored.value):
        goldens = GoldenFile.for_pair(point.runbook.path, point.runbook.name, point.profile.name)
        curve = goldens.get(point_id(point), hardware_class(machine))
        itself = ("; that curve was blessed from this very run, which it matches by construction"
                  if curve is not None and curve.run == run else "")
        why = f"against {goldens.path}, which changed since the run"
        then = re.fullmatch(r"steps 1-(\d+)", stored.window)
        if then and stored.window != now.window:
            # golden_steps changed: the file changed too only where the steps the run compared
            # compare otherwise against it now
            old = gate(dataclasses.replace(point, phase=dataclasses.replace(point.phase, golden_steps=int(then[1]))),
                       csv, machine, results_dir)
            same = old is not None and (old.verdict, old.value) == (stored.verdict, stored.value)
            steps = f"golden_steps changed since the run (it compared {stored.window}, {now.window} now)"
            why = f", as {steps}; {goldens.path} gives the run's {stored.window} the same result as at the run" if same else \
                f"{why}, and {steps}"
        now = dataclasses.replace(now, note=f"{now.note}; re-checked at report time{'' if why.startswith(',') else ' '}{why} "
                                            f"(then: {stored.verdict})"
                                            f"{itself}")
    return Recheck(stored, now)


def check_readable(runbook_path: Path, runbook: str, profile: str) -> None:
    """Raise GoldenError now if the pair's golden file cannot be read (before any point runs)."""
    GoldenFile.for_pair(runbook_path, runbook, profile)


@dataclass(frozen=True)
class Spread:
    """How far several runs of one point are apart, step by step."""

    runs: int
    steps: int
    max_abs: float
    max_rel: float
    first_step: int | None
    """The first step at which the runs differ at all (None: identical to the printed digits)."""


def spread(curves: list[list[float]]) -> Spread:
    """The largest difference between any two of ``curves`` (the same point's loss from several
    runs) over their common steps, absolute and relative to the smallest value's magnitude."""
    n = min(len(c) for c in curves)
    max_abs = max_rel = 0.0
    first = None
    for i in range(n):
        vals = [c[i] for c in curves]
        diff = max(vals) - min(vals)
        if diff > 0 and first is None:
            first = i + 1
        max_abs = max(max_abs, diff)
        max_rel = max(max_rel, diff / max(min(abs(v) for v in vals), 1e-12))
    return Spread(len(curves), n, max_abs, max_rel, first)
