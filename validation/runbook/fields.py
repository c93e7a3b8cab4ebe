"""Strict reading of runbook YAML: every mapping checked for unknown and missing keys, every
value for its type and, for names that end up in paths, override strings or environment
variables, for a conservative pattern. Every error names the file and the dotted key."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from nsa.yaml_unique import DuplicateKeyError, safe_load_unique
from validation.errors import RunbookError
from validation.judge.gates import OPS, Gate, Window
from validation.judge.metrics import METRICS, Source
from validation.judge.record import TRAINER_KINDS
from validation.runbook import empty, keys
from validation.runbook.schema import MODULE, NAME, Limit
from validation.runbook.types import Launcher, Phase, Rendezvous, Scalar, sweep_part

LAUNCHER_KINDS = ("python", "torchrun", "slurm")
#: each launcher kind's keys (torchrun's nproc is per node; Slurm says nodes and nproc_per_node)
LAUNCHER_KEYS = {"python": ("kind", "nproc", "module", "torchrun_args"),
                 "torchrun": ("kind", "nproc", "module", "torchrun_args", "nnodes", "rdzv"),
                 "slurm": ("kind", "nodes", "nproc_per_node", "module", "rdzv", "srun_args", "torchrun_args")}
RDZV_BACKENDS = ("c10d",)
#: seconds the agents of a multi-node launch need beyond the join timeout to start and to exit: the
#: phase's stall_s must leave them, or the stall watch ends a rendezvous still waiting for a node
JOIN_MARGIN_S = 10.0
#: kind torchrun starts every node's agent on this host: its store is on a loopback address
_LOCAL_ENDPOINT = re.compile(r"^(localhost|127(\.\d{1,3}){3}):(?P<port>\d{1,5})$")
#: torchrun options that launcher.rdzv and nnodes set for a launch of several nodes
_RDZV_OPTIONS = ("--standalone", "--nnodes", "--rdzv", "--node_rank", "--node-rank", "--master", "--nproc",
                 "--local_addr", "--local-addr")
_SRUN_ARG = re.compile(r"^--[a-z][a-z0-9-]*(=[A-Za-z0-9_.:,/@%+=-]+)?$")
#: srun options the harness sets itself (its job name, nodes and tasks, per-node logs, the
#: environment that carries the run token)
SRUN_OWN = ("--job-name", "--jobid", "--nodes", "--ntasks", "--ntasks-per-node", "--output", "--error", "--input",
            "--export", "--chdir", "--overlap", "--label", "--kill-on-bad-exit")

OVERRIDE_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")
_ENV_KEY = re.compile(r"^[A-Z_][A-Z0-9_]*$")
#: environment variables a runbook may set; anything else (LD_PRELOAD, PATH, PYTHONPATH...) is
#: refused because it would change what runs rather than how the trainer is configured.
ENV_PREFIXES = ("NSA_", "NCCL_", "TORCH_", "PYTORCH_", "CUDA_", "OMP_", "MKL_", "TRITON_")
ENV_EXACT = ("CONFIG",)
#: a runbook's own trainer (its ``trainer:`` entry) reads its settings from variables of its own
#: naming (MY_TRAINER_STEPS): any name but those that change what runs or how a program is loaded,
#: and the harness's own (its run token, the contract's profile request)
TRAINER_ENV_DENIED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "VALIDATION_", "CONTRACT_", "BASH_", "GIT_")
TRAINER_ENV_DENIED = ("PATH", "HOME", "SHELL", "ENV", "IFS", "PS4", "PERL5LIB", "PERL5OPT", "RUBYOPT", "NODE_OPTIONS",
                       "GCONV_PATH", "LOCPATH", "TMPDIR", "USER", "LOGNAME")
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.:,+/@=-]*$")
_TORCHRUN_ARG = re.compile(r"^--[a-z][a-z0-9_-]*(=[A-Za-z0-9_.:,/@-]+)?$")
_WINDOW = re.compile(r"^\s*last\s+(\d+)\s+steps?\s*$", re.IGNORECASE)


def read_yaml(path: Path, section: keys.Section) -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RunbookError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise RunbookError(f"{path}: a directory, expected a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunbookError(f"{path}: not a readable YAML text file ({exc})") from None
    try:
        data = safe_load_unique(text)
    except DuplicateKeyError as exc:  # PyYAML would keep the last value: gates twice judged by the second
        raise RunbookError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise RunbookError(f"{path}: not valid YAML ({exc})") from None
    if data is None:
        raise RunbookError(f"{path}: the file is empty; expected a mapping of keys ({', '.join(section.required or section.names)}, "
                           "...)")
    if not isinstance(data, dict):
        raise RunbookError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


_OWN = object()  # Reader.value's default: the key's declared default


class Reader:
    """Reads one mapping strictly; every error names the file and the dotted key.

    ``allowed`` is the mapping's section of validation/runbook/keys.py (or, for a mapping no
    section describes, its key names). A key present with nothing after it (YAML's null) is an
    error saying what was expected, unless its section says what an empty value means
    (validation/runbook/empty.py); a key of another section names the section it belongs to."""

    def __init__(self, path: Path, data: Any, where: str, allowed: keys.Section | tuple[str, ...],
                 required: tuple[str, ...] | None = None):
        self.path, self.where = path, where
        section = allowed if isinstance(allowed, keys.Section) else None
        self.section = section
        if section is not None:
            allowed = section.names
            required = section.required if required is None else required
        required = required or ()
        if data is None and where:
            self.fail(where, empty.empty_item(where) if where.endswith("]") else empty.EMPTY_MAPPING)
        if not isinstance(data, Mapping):
            self.fail(where or "top level", f"expected a mapping, got {type(data).__name__}")
        nullable = section.nullable if section is not None else ()
        for k, v in data.items():
            if k not in allowed:
                unknown = [u for u in data if u not in allowed]
                said = "; ".join(f"{u}{empty.misplaced(u, section, allowed)}" for u in unknown[1:])
                more = f"; also unknown here: {said}" if said else ""
                self.fail(self.key(str(k)), f"unknown key{empty.misplaced(k, section, allowed)}{more}; "
                                            f"allowed here: {', '.join(allowed)}")
            if v is None and k not in nullable:
                self.fail(self.key(str(k)), empty.empty_key(str(k), section.meaning(k) if section else "",
                                                            k in required))
        for k in required:
            if k not in data:
                self.fail(self.key(k), "required key is missing")
        self.data = data

    def key(self, k: str) -> str:
        return f"{self.where}.{k}" if self.where else k

    def fail(self, key: str, msg: str):
        raise RunbookError(f"{self.path}: {key}: {msg}")

    def get(self, k: str, default: Any = None) -> Any:
        return self.data.get(k, default)

    def str_(self, k: str, default: str | None = None, pattern: re.Pattern | None = None, choices=None) -> Any:
        v = self.data.get(k, default)
        if v is None:
            return None
        if not isinstance(v, str):
            self.fail(self.key(k), f"expected a string, got {v!r}")
        if pattern is not None and not pattern.match(v):
            self.fail(self.key(k), f"{v!r} is not allowed here (must match {pattern.pattern})")
        if choices is not None and v not in choices:
            self.fail(self.key(k), f"{v!r} is not one of {', '.join(choices)}")
        return v

    def int_(self, k: str, default: int | None = None, minimum: int = 0) -> Any:
        return self._number(k, default, minimum, (int,), "an integer")

    def num(self, k: str, default: float | None = None, minimum: float = 0.0) -> Any:
        v = self._number(k, default, minimum, (int, float), "a number")
        return None if v is None else float(v)

    def _number(self, k: str, default, minimum, types: tuple[type, ...], what: str) -> Any:
        v = self.data.get(k, default)
        if v is not None and (not is_number(v, types) or v < minimum):
            self.fail(self.key(k), f"expected {what} >= {minimum}, got {v!r}")
        return v

    def value(self, k: str, default: Any = _OWN) -> Any:
        """The scalar key ``k`` checked as its declaration says (its type, minimum, pattern or
        choices; validation/runbook/schema.py), or ``default`` (else its declared default) without it."""
        spec = self.section.key(k)
        if default is _OWN:
            default = spec.default
        if spec.type is int:
            return self.int_(k, default, minimum=int(spec.minimum or 0))
        if spec.type is float:
            return self.num(k, default, minimum=float(spec.minimum or 0))
        return self.str_(k, default, pattern=spec.pattern, choices=spec.choices)

    def list_(self, k: str) -> list:
        v = self.data.get(k, [])
        if not isinstance(v, list):
            self.fail(self.key(k), f"expected a list, got {type(v).__name__}")
        return v


def _scalar(r: Reader, key: str, v: Any) -> Scalar:
    if v is None:
        r.fail(key, empty.EMPTY_SCALAR)
    if isinstance(v, bool) or isinstance(v, (int, float)):
        return v
    if isinstance(v, str) and _SAFE_VALUE.match(v):
        return v
    r.fail(key, f"value {v!r} must be a number, a boolean or a string without spaces or shell characters")


# ------------------------------------------------------------------------------- phase pieces
#: the phase kinds whose runs leave each source a metric reads (a source not here: every kind's)
SOURCE_KINDS: dict[Source, tuple[str, ...]] = {
    **{s: TRAINER_KINDS for s in (Source.CSV, Source.HEARTBEAT, Source.ENV, Source.HALT)},
    Source.JUNIT: ("pytest",), Source.PREFLIGHT: ("preflight",),
    Source.PROFILE: ("profile",), Source.TIMELINE: ("profile",)}


def parse_window(r: Reader, key: str, v: Any) -> Window:
    if v is None or v == "all":
        return Window()
    if isinstance(v, str):
        m = _WINDOW.match(v)
        if m and int(m.group(1)) > 0:
            return Window(int(m.group(1)))
    last = v.get("last") if isinstance(v, Mapping) and set(v) == {"last"} else None
    if isinstance(last, int) and not isinstance(last, bool) and last > 0:
        return Window(last)
    r.fail(key, f"window {v!r} not understood; write 'last N steps', {{last: N}} or 'all'")


def is_number(v: Any, types: tuple[type, ...] = (int, float)) -> bool:
    """Whether v is a finite number of ``types``: YAML's .nan and .inf are floats, but a gate
    against NaN never holds (and != always does) and one against an infinity asks nothing."""
    return isinstance(v, types) and not isinstance(v, bool) and (isinstance(v, int) or math.isfinite(v))


def _gate(path: Path, data: Any, where: str) -> Gate:
    r = Reader(path, data, where, keys.GATE)
    metric = r.str_("metric")
    if metric not in METRICS:
        r.fail(r.key("metric"), f"unknown metric {metric!r}; metrics: {', '.join(sorted(METRICS))}")
    op = r.get("op")
    if op not in OPS:
        r.fail(r.key("op"), f"unknown comparison {op!r}; allowed: {', '.join(OPS)}")
    thr, ref = r.get("threshold"), None
    if isinstance(thr, Mapping):
        tr = Reader(path, thr, r.key("threshold"), ("profile",), ("profile",))
        ref, thr = tr.str_("profile", pattern=NAME), None
    elif not is_number(thr):
        r.fail(r.key("threshold"), f"expected a finite number or {{profile: KEY}}, got {thr!r}")
    else:
        thr = float(thr)
    window = parse_window(r, r.key("window"), r.get("window"))
    return Gate(metric, op, thr, window, ref, r.str_("description", "") or "")


def parse_launcher(path: Path, data: Any, where: str, base: Launcher) -> Launcher:
    r = Reader(path, data, where, keys.LAUNCHER)
    kind = r.str_("kind", base.kind, choices=LAUNCHER_KINDS)
    for k in r.data:
        if k not in LAUNCHER_KEYS[kind]:
            owners = [n for n, names in LAUNCHER_KEYS.items() if k in names]
            r.fail(r.key(k), f"a key of kind {' or '.join(owners)} launchers; kind {kind} takes "
                             f"{', '.join(LAUNCHER_KEYS[kind])}")
    same = kind == base.kind
    if kind == "slurm":
        return _slurm_launcher(r, base if same else Launcher("slurm"))
    nproc = r.int_("nproc", base.nproc if same else 1, minimum=1)
    if kind == "python" and nproc != 1:
        r.fail(r.key("nproc"), "the python launcher runs one process; use kind: torchrun for nproc > 1")
    module = r.str_("module", base.module, pattern=MODULE)
    args = _torchrun_args(r, base)
    nnodes = r.int_("nnodes", base.nnodes if same else 1, minimum=1)
    rdzv = None
    if nnodes > 1 or "rdzv" in r.data:
        if nnodes == 1:
            r.fail(r.key("rdzv"), "a rendezvous is for nnodes > 1 (one torchrun agent per node)")
        if "rdzv" not in r.data and not (same and base.rdzv):
            r.fail(r.key("rdzv"), "nnodes > 1 needs a rendezvous: rdzv: {endpoint: localhost:0, join_timeout_s: 60}")
        rdzv = _rendezvous(r, "torchrun") if "rdzv" in r.data else base.rdzv
        _no_rendezvous_options(r, args, "nnodes and rdzv set the rendezvous of several nodes")
    return Launcher(kind, nproc, module, args, nnodes, rdzv)


def _torchrun_args(r: Reader, base: Launcher) -> tuple[str, ...]:
    """``torchrun_args:``, torchrun's own options for every agent (--max-restarts=1, ...)."""
    args = r.get("torchrun_args", list(base.torchrun_args))
    if not isinstance(args, list) or not all(isinstance(a, str) and _TORCHRUN_ARG.match(a) for a in args):
        r.fail(r.key("torchrun_args"), f"expected a list of --option=value strings, got {args!r}")
    return tuple(args)


def _no_rendezvous_options(r: Reader, args: tuple[str, ...], why: str) -> None:
    """Refuse rendezvous options among a launch of several nodes' torchrun_args: the harness sets them."""
    own = [a for a in args if a.startswith(_RDZV_OPTIONS)]
    if own:
        r.fail(r.key("torchrun_args"), f"{own[0]!r}: {why}")


def _slurm_launcher(r: Reader, base: Launcher) -> Launcher:
    """``{kind: slurm, nodes: N, nproc_per_node: M, rdzv: {join_timeout_s: S}, srun_args: [...],
    torchrun_args: [...]}``."""
    nodes = r.int_("nodes", base.nnodes, minimum=1)
    nproc = r.int_("nproc_per_node", base.nproc, minimum=1)
    module = r.str_("module", base.module, pattern=MODULE)
    if "rdzv" not in r.data and base.rdzv is None:
        r.fail(r.key("rdzv"), "required: rdzv: {join_timeout_s: S} (how long an agent waits for the other nodes)")
    rdzv = _rendezvous(r, "slurm") if "rdzv" in r.data else base.rdzv
    args = r.get("srun_args", list(base.srun_args))
    if not isinstance(args, list):
        r.fail(r.key("srun_args"), f"expected a list of --option=value strings, got {args!r}")
    for i, a in enumerate(args):
        key = r.key(f"srun_args[{i}]")
        if not isinstance(a, str) or not _SRUN_ARG.match(a):
            r.fail(key, f"{a!r}: write srun's long options, one per item: --partition=gpu, --time=00:30:00")
        if a.split("=", 1)[0] in SRUN_OWN:
            r.fail(key, f"{a!r} is set by the harness ({', '.join(SRUN_OWN)})")
    torchrun_args = _torchrun_args(r, base)
    _no_rendezvous_options(r, torchrun_args, "the harness sets the rendezvous of a Slurm launch")
    return Launcher("slurm", nproc, module, torchrun_args, nodes, rdzv, tuple(args))


def _rendezvous(launcher: Reader, kind: str) -> Rendezvous:
    """``rdzv:`` of a torchrun launch of several nodes (endpoint on this host) or of Slurm (port)."""
    local = kind == "torchrun"
    allowed = tuple(k for k in keys.RDZV.names if k != ("port" if local else "endpoint"))
    r = Reader(launcher.path, launcher.get("rdzv"), launcher.key("rdzv"), allowed,
               ("endpoint", "join_timeout_s") if local else keys.RDZV.required)
    r.str_("backend", "c10d", choices=RDZV_BACKENDS)
    join = r.num("join_timeout_s", minimum=1.0)
    if not local:
        port = r.int_("port", None, minimum=1)
        if port is not None and port > 65535:
            r.fail(r.key("port"), f"{port} is not a TCP port (1..65535)")
        return Rendezvous(join, port=port)
    endpoint = r.str_("endpoint")
    m = _LOCAL_ENDPOINT.match(endpoint)
    if m is None or int(m["port"]) > 65535:
        r.fail(r.key("endpoint"), f"{endpoint!r}: kind torchrun starts every node's agent on this host, so the "
                                  "endpoint is localhost:PORT or 127.x.x.x:PORT (port 0: a free one at launch); "
                                  "across machines use kind: slurm")
    return Rendezvous(join, endpoint=endpoint)


def check_join_timeout(r: Reader, launcher_key: str, launcher: Launcher, startup_after_s: float) -> None:
    """A node that never joins must be found by the rendezvous (its join timeout), not cut short
    by the stall watch, whose start-up allowance (startup_s, else stall_s) counts from the launch."""
    rdzv = launcher.rdzv
    if rdzv is not None and rdzv.join_timeout_s + JOIN_MARGIN_S > startup_after_s:
        r.fail(f"{launcher_key}.rdzv.join_timeout_s",
               f"{rdzv.join_timeout_s:g} s + {JOIN_MARGIN_S:g} s for the agents to start and exit is more than the "
               f"phase's start-up allowance ({startup_after_s:g} s): the stall watch would end a rendezvous still "
               "waiting for a node, and the missing node would go unnamed; lower it or raise startup_s (or stall_s)")


def _items(r: Reader, key: str, data: Any, what: str) -> list[tuple[Any, Any]]:
    """A mapping's items (none for a missing one); anything else is an error naming ``what``."""
    if data is None:
        return []
    if not isinstance(data, Mapping):
        r.fail(key, f"expected a mapping {what}, got {type(data).__name__}")
    return list(data.items())


def parse_overrides(r: Reader, key: str, data: Any) -> dict[str, Scalar]:
    out = {}
    for k, v in _items(r, key, data, "of dotted.key: value"):
        if not isinstance(k, str) or not OVERRIDE_KEY.match(k):
            r.fail(f"{key}.{k}", "override keys are dotted lower-case names like train.seq_len")
        out[k] = _scalar(r, f"{key}.{k}", v)
        _check_path(r, f"{key}.{k}", k, v)
    return out


def _check_path(r: Reader, key: str, k: str, v: Any) -> None:
    """A value of a path-like key (data.path, train.out_dir, train.resume, ...) stays inside."""
    if k.endswith((".path", ".out_dir", "_dir", "_path", ".resume")) and isinstance(v, str) and not _inside(v):
        r.fail(key, f"path {v!r} must be relative and stay inside the repository (no '..')")


def _inside(v: str) -> bool:
    return not v.startswith(("/", "~")) and ".." not in Path(v).parts


def check_env_key(r: Reader, key: str, k: Any) -> None:
    if not isinstance(k, str) or not _ENV_KEY.match(k) or not (k in ENV_EXACT or k.startswith(ENV_PREFIXES)):
        r.fail(key, f"environment variable {k!r} may not be set by a runbook "
                    f"(allowed: {', '.join(ENV_EXACT)} and names starting {', '.join(ENV_PREFIXES)}); a variable of "
                    "the runbook's own trainer goes in trainer.env, or in trainer.params as {env: NAME}, a key the "
                    "phases' overrides set")


def check_trainer_env_key(r: Reader, key: str, k: Any) -> None:
    """A variable a runbook's own trainer reads (its trainer: entry): any upper-case name but the
    ones that change what runs (the loader's, the interpreters', PATH) and the harness's own."""
    if not isinstance(k, str) or not _ENV_KEY.match(k) or k in TRAINER_ENV_DENIED or \
            k.startswith(TRAINER_ENV_DENIED_PREFIXES):
        r.fail(key, f"environment variable {k!r} may not be set for a trainer (refused: "
                    f"{', '.join(TRAINER_ENV_DENIED)} and names starting {', '.join(TRAINER_ENV_DENIED_PREFIXES)}; "
                    "names are upper case)")


def parse_env(r: Reader, key: str, data: Any, check=check_env_key) -> dict[str, str]:
    out = {}
    for k, v in _items(r, key, data, "NAME: value"):
        check(r, f"{key}.{k}", k)
        v = _scalar(r, f"{key}.{k}", v)
        out[k] = ("1" if v else "0") if isinstance(v, bool) else str(v)
    return out


def _sweep(r: Reader, key: str, data: Any) -> dict[str, tuple[Scalar, ...]]:
    """``{train.seq_len: [512, 1024], env.NSA_DDP_BUCKET_MB: [25, 50]}``: override keys, or
    environment variables prefixed ``env.``."""
    if data is None:
        return {}
    if not isinstance(data, Mapping) or not data:
        r.fail(key, "expected a non-empty mapping of parameter: [values]")
    out = {}
    for k, values in data.items():
        kk = f"{key}.{k}"
        if isinstance(k, str) and k.startswith("env."):
            check_env_key(r, kk, k[4:])
        elif not isinstance(k, str) or not OVERRIDE_KEY.match(k):
            r.fail(kk, "sweep parameters are override keys (train.seq_len) or env.NAME")
        if not isinstance(values, list) or not values:
            r.fail(kk, f"expected a non-empty list of values, got {values!r}")
        out[k] = tuple(_scalar(r, kk, v) for v in values)
        named: dict[str, Scalar] = {}
        for v in out[k]:
            _check_path(r, kk, k, v)
            part = sweep_part(k, v)
            if part in named:  # two points of one id: one would run twice, the other never be stored
                r.fail(kk, f"values {named[part]!r} and {v!r} make the same point ({part}): list each value once")
            named[part] = v
    short = {}
    for k in out:  # the points name a parameter by its key's last part
        if (name := k.split(".")[-1]) in short:
            r.fail(key, f"{short[name]} and {k} would name their points alike ({name}=...): sweep one of them")
        short[name] = k
    return out


def _test_path(r: Reader, key: str, v: Any) -> str:
    """pytest targets stay inside the repository: relative, no '..', no option injection."""
    if not isinstance(v, str) or not v or v.startswith(("-", "/")) or ".." in Path(v.split("::")[0]).parts:
        r.fail(key, f"{v!r} must be a relative path inside the repository (no '..', not an option)")
    if not re.match(r"^[A-Za-z0-9_./\[\]:-]+$", v):
        r.fail(key, f"{v!r} contains characters not allowed in a test path")
    return v


def _watch_s(r: Reader, key: str, kind: str, timeout_s: float, default: float | None) -> float | None:
    """A watch allowance of a phase that runs the trainer (``WATCHED``): at least its minimum
    and below its timeout (else the timeout always comes first); only those phases are watched,
    and only they take the defaults' value."""
    own = r.value(key, None)
    if own is not None and kind not in TRAINER_KINDS:
        r.fail(r.key(key), f"only phases that run the trainer ({', '.join(TRAINER_KINDS)}) are watched for "
                           f"stalls, not kind {kind!r}")
    value = own if own is not None else (default if kind in TRAINER_KINDS else None)
    if value is not None and value >= timeout_s:
        where = r.key(key) if own is not None else f"defaults.{key} (for {r.where})"
        r.fail(where, f"{value:g} s is not below the phase's timeout_s ({timeout_s:g} s): the timeout would "
                      "always end a hang first")
    return value


#: what the stall watch ends (validation/launch/watch.py): its allowances are keys of phases that run the trainer
WATCHED = (Limit.QUIET, Limit.START)
_PYTEST_ARG = re.compile(r"^(-k|-m|-x|-q|-v|--maxfail=\d+|--hypothesis-seed=\d+|[A-Za-z0-9_ ().\[\]-]+)$")

def parse_phase(path: Path, data: Any, where: str, defaults: dict[str, Any], known_markers: set[str] | None) -> Phase:
    r = Reader(path, data, where, keys.PHASE)
    name = r.value("name")
    kind = r.value("kind")
    markers = r.list_("markers")
    for i, m in enumerate(markers):
        if not isinstance(m, str) or not NAME.match(m):
            r.fail(r.key(f"markers[{i}]"), f"bad marker {m!r}")
        if known_markers is not None and m not in known_markers:
            r.fail(r.key(f"markers[{i}]"), f"marker {m!r} is not registered in pytest.ini")
    launcher = parse_launcher(path, r.get("launcher", {}), r.key("launcher"), defaults["launcher"])
    overrides = {**defaults["overrides"], **parse_overrides(r, r.key("overrides"), r.get("overrides"))}
    env = {**defaults["env"], **parse_env(r, r.key("env"), r.get("env"))}
    gates = tuple(_gate(path, g, r.key(f"gates[{i}]")) for i, g in enumerate(r.list_("gates")))
    tests = tuple(_test_path(r, r.key(f"tests[{i}]"), t) for i, t in enumerate(r.list_("tests")))
    pargs = r.list_("pytest_args")
    for i, a in enumerate(pargs):
        if not isinstance(a, str) or not _PYTEST_ARG.match(a):
            r.fail(r.key(f"pytest_args[{i}]"), f"{a!r} is not an allowed pytest argument")
    if kind == "pytest" and not tests:
        r.fail(r.key("tests"), "a pytest phase needs at least one test path")
    for own in ("tests", "pytest_args"):
        if kind != "pytest" and r.get(own) is not None:
            r.fail(r.key(own), f"only pytest phases run tests, not kind {kind!r}")
    for own in ("overrides", "sweep"):  # the phase's own: defaults.overrides are every phase's
        if kind == "pytest" and r.get(own) is not None:
            r.fail(r.key(own), "a pytest phase runs no trainer: its points would run the same tests alike")
    config = r.value("config", defaults["config"])
    golden_steps = r.value("golden_steps")
    if golden_steps and kind != "train":
        r.fail(r.key("golden_steps"), f"golden loss curves need a train phase, not kind {kind!r}")
    steps = r.value("steps", defaults["steps"])
    if golden_steps > steps:
        r.fail(r.key("golden_steps"), f"{golden_steps} is more than the phase's {steps} steps")
    timeout_s = r.value("timeout_s", defaults["timeout_s"])
    profile_steps = r.value("profile_steps")
    if kind == "profile" and not 1 <= profile_steps <= steps:
        r.fail(r.key("profile_steps"), f"a profile phase names the steps to profile, 1..steps ({steps}), the trainer "
                                       f"profiling them once steady (warm-up and graph capture done); got {profile_steps}")
    if profile_steps and kind != "profile":
        r.fail(r.key("profile_steps"), f"only profile phases profile steps, not kind {kind!r}")
    resume_after = r.value("resume_after")
    if kind == "resume" and not 1 <= resume_after < steps:
        r.fail(r.key("resume_after"), f"a resume phase stops after resume_after steps and resumes for the rest of its "
                                      f"{steps} steps: 1..{steps - 1}; got {resume_after}")
    if resume_after and kind != "resume":
        r.fail(r.key("resume_after"), f"only resume phases stop and resume, not kind {kind!r}")
    repeats = r.value("repeats")
    if repeats > 1 and kind != "train":
        r.fail(r.key("repeats"), f"only train phases are repeated (a mean with a confidence interval), not kind {kind!r}")
    for i, g in enumerate(gates):
        sources = [str(inp.source) for inp in METRICS[g.metric].reads if kind not in SOURCE_KINDS.get(inp.source, (kind,))]
        if sources:  # its run writes no such file: the gate would be no data, a failure with nothing said
            kinds = sorted({k for inp in METRICS[g.metric].reads for k in SOURCE_KINDS.get(inp.source, ())})
            r.fail(r.key(f"gates[{i}].metric"), f"metric {g.metric} reads {', '.join(sources)}, which a {kind} phase "
                                                f"does not write; it is a metric of {' and '.join(kinds)} phases")
        if g.window.last is not None and not METRICS[g.metric].windowed:
            # it would be shown beside the gate and not applied
            r.fail(r.key(f"gates[{i}].window"), f"metric {g.metric} takes no window (it reads the whole run); "
                                                f"leave window out")
        # a window no run of the phase can cover would always be NO_DATA
        if kind in TRAINER_KINDS and g.window.last is not None and g.window.last > steps and METRICS[g.metric].windowed:
            r.fail(r.key(f"gates[{i}].window"), f"{g.window.describe()} is longer than the phase's {steps} steps")
    # the stall watch's allowances, between steps and before the first
    watches = {k.name: _watch_s(r, k.name, kind, timeout_s, defaults[k.name]) for k in r.section.keys
               if k.limit in WATCHED}
    phase = Phase(
        name=name, kind=kind, description=r.value("description") or "", markers=tuple(markers),
        launcher=launcher, config=config, overrides=overrides, env=env, steps=steps, timeout_s=timeout_s,
        sweep=_sweep(r, r.key("sweep"), r.get("sweep")), gates=gates, tests=tests, pytest_args=tuple(pargs),
        min_gpus=r.value("min_gpus", defaults["min_gpus"]), golden_steps=golden_steps, profile_steps=profile_steps,
        resume_after=resume_after, repeats=repeats, **watches,
    )
    if kind in TRAINER_KINDS:
        # the nodes meet before the first step: the start-up allowance must leave the join timeout
        key = r.key("launcher") if "launcher" in r.data else f"defaults.launcher (for {r.where})"
        check_join_timeout(r, key, launcher, phase.startup_after_s)
    return phase
