"""The ``trainer:`` entry of a runbook: how to launch a trainer other than this project's own
(``python -m nsa.train``, the default, which needs no entry) and what it supports.

```yaml
trainer:
  name: seed_showcase
  root: {env: NSA_SEED_ROOT}        # or a path relative to this repository (tests/trainers)
  script: scripts/train_showcase.py # or module: pkg.train; relative to root
  args: [--dataset, synthetic]      # placeholders: {steps} {out_dir} {config} {nproc}
  config:                           # optional: a per-point copy of the trainer's own YAML
    template: configs/train_showcase.yaml   # relative to root
    pass_as: {env: CONFIG}                  # or {flag: --config}
  steps: {flag: --steps}            # {flag: ...}, {env: ...} or {config: dotted.key}
  out_dir: {config: train.out_dir}
  params: {train.seq_len: {config: train.seq_len}}   # every override/sweep key the runbook uses
  env: {NSA_HEARTBEAT_EVERY: 1}
  format: seed                      # its files: contract (written natively), seed, torchtitan, hf_trainer
  phases: [train, preflight]        # phase kinds it supports; others are SKIP
  metrics: [toks_per_s_mean, ...]   # optional: metrics it provides (default: all its adapter can)
  tokens_per_step: [train.batch_size, train.seq_len]  # optional: one rank's tokens per step, as factors
  requires: [transformers]          # optional: packages it imports that a machine may lack (else not launched)
  resume:                           # optional: how it stops and resumes (needed for phases: [resume])
    stop_after: {flag: --stop-after}  # receives N: train steps 1..N of the whole run, checkpoint, exit 0
    from: {flag: --resume-from}       # receives the first half's output directory to continue from
```

The root is the trainer's working directory and its ``PYTHONPATH``; launch stays python or
torchrun from argument lists (a phase's ``launcher`` gives kind, nproc and rendezvous options; its
``module`` and ``config`` belong to this project's trainer and are refused beside this entry). Every path a runbook names stays inside the root (or the
repository) it is relative to; a root from an environment variable is the user's own choice.
"""
from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any, Mapping

from validation.contract.adapters import FORMAT_OF  # the runbook's name of an adapter's format
from validation.errors import RunbookError
from validation.runbook import keys
from validation.runbook.empty import EMPTY_MAPPING
from validation.runbook.fields import MODULE, NAME, OVERRIDE_KEY, Reader, check_trainer_env_key, parse_env
from validation.runbook.schema import PACKAGE
from validation.runbook.types import ConfigFile, Delivery, ResumeSpec, RootDir, TrainerSpec, Via

#: values the harness fills into ``args``
PLACEHOLDERS = ("steps", "out_dir", "config", "nproc")
#: phase kinds a foreign trainer may support (pytest phases run this project's own tests; a
#: profile phase is a train run that asks for profile.json through the contract)
FOREIGN_PHASE_KINDS = ("train", "profile", "preflight", "resume")
_ARG_CHARS = frozenset(string.ascii_letters + string.digits + "_.:,+/@=-{}")
_FLAG = re.compile(r"^--?[A-Za-z][A-Za-z0-9_.-]*$")  # dotted: torchtitan's --training.steps
_CONFIG_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def parse_trainer(path: Path, data: Any, known_metrics: Mapping[str, Any], adapters: Mapping[str, Any]) -> TrainerSpec:
    r = Reader(path, data, "trainer", keys.TRAINER)
    if ("script" in r.data) == ("module" in r.data):
        r.fail("trainer", "give exactly one of script (a .py path under the root) or module (a dotted name)")
    if "script" in r.data:
        script = _relative(r, "script", r.str_("script"))
        if not script.endswith(".py"):
            r.fail("trainer.script", f"{script!r} is not a .py file")
        entry: tuple[str, ...] = (script,)
    else:
        entry = ("-m", r.str_("module", pattern=MODULE))
    args = tuple(_arg(r, f"trainer.args[{i}]", a) for i, a in enumerate(r.list_("args")))
    config = _config(path, r.get("config")) if "config" in r.data else None
    steps = _delivery(path, r.get("steps"), "trainer.steps", config) if "steps" in r.data else None
    out_dir = _delivery(path, r.get("out_dir"), "trainer.out_dir", config) if "out_dir" in r.data else None
    joined = " ".join(args)
    for what, d in (("steps", steps), ("out_dir", out_dir)):
        if d is None and "{" + what + "}" not in joined:
            r.fail(f"trainer.{what}", f"say how {what} reaches the trainer: {{flag: ...}}, {{env: ...}}, "
                                      f"{{config: dotted.key}}, or a {{{what}}} placeholder in args")
    if config is None and "{config}" in joined:
        r.fail("trainer.args", "the {config} placeholder needs trainer.config (the template the harness copies)")
    if config is not None and config.pass_as is None and "{config}" not in joined:
        r.fail("trainer.config.pass_as", "say how the config's path reaches the trainer: {env: NAME}, "
                                         "{flag: --name}, or a {config} placeholder in args")
    params = {}
    raw_params = r.get("params") or {}
    if not isinstance(raw_params, Mapping):
        r.fail("trainer.params", "expected a mapping of runbook key: {flag|env|config: name}")
    for k, v in raw_params.items():
        if not isinstance(k, str) or not OVERRIDE_KEY.match(k):  # the keys the phases' overrides and sweeps set
            r.fail(f"trainer.params.{k}", "parameter names are dotted lower-case keys like train.lr, as the phases' "
                                          "overrides and sweeps name them")
        params[k] = _delivery(path, v, f"trainer.params.{k}", config)
    # the runbook names the format of the trainer's own files; "contract" is the registry's native adapter
    if r.get("format") in FORMAT_OF:  # the adapter's own name ('native'), as check-artifacts once took it
        r.fail("trainer.format", f"{r.get('format')!r} is not one of {', '.join(FORMAT_OF.get(a, a) for a in adapters)}: "
                                 f"a trainer that writes the contract itself is format {FORMAT_OF[r.get('format')]} "
                                 "(the default)")
    fmt = r.str_("format", "contract", choices=tuple(FORMAT_OF.get(a, a) for a in adapters))
    adapter = next(a for a in adapters if FORMAT_OF.get(a, a) == fmt)
    phases = r.list_("phases") if "phases" in r.data else ["train"]
    if not phases:  # [] read as the default once: a trainer said to support nothing ran every train phase
        r.fail("trainer.phases", f"an empty list names no phase kind the trainer supports (every phase would be "
                                 f"SKIP); list the kinds it supports ({', '.join(FOREIGN_PHASE_KINDS)}), or leave the "
                                 f"key out for [train]")
    for i, p in enumerate(phases):
        if p not in FOREIGN_PHASE_KINDS:
            r.fail(f"trainer.phases[{i}]", f"{p!r}: a trainer named here supports only {', '.join(FOREIGN_PHASE_KINDS)} "
                                           "(pytest phases run this project's own tests)")
    metrics = None
    if "metrics" in r.data:
        metrics = tuple(r.list_("metrics"))
        for i, m in enumerate(metrics):
            if m not in known_metrics:
                r.fail(f"trainer.metrics[{i}]", f"unknown metric {m!r}; metrics: {', '.join(sorted(known_metrics))}")
    tokens = _tokens_per_step(r, params) if "tokens_per_step" in r.data else None
    if tokens is not None and not adapters[adapter].takes_tokens_per_step:
        takers = ", ".join(FORMAT_OF.get(a, a) for a, ad in adapters.items() if ad.takes_tokens_per_step)
        r.fail("trainer.tokens_per_step", f"format {fmt} reads its tokens/s from the trainer's own files, not from "
                                          f"this key (formats that take it: {takers}); leave it out")
    resume = _resume(path, r.get("resume"), config) if "resume" in r.data else None
    if ("resume" in phases) != (resume is not None):
        r.fail("trainer.resume", "a trainer that supports resume phases says how it stops after N steps and "
                                 "resumes (trainer.resume: {stop_after: ..., from: ...}), and one that says so lists "
                                 "resume in trainer.phases")
    return TrainerSpec(r.str_("name", pattern=NAME), _root(r), entry, args, config, steps, out_dir,
                       params, parse_env(r, "trainer.env", r.get("env"), check_trainer_env_key), adapter, tuple(phases), metrics, resume,
                       tokens, _requires(r))


def _requires(r: Reader) -> tuple[str, ...]:
    """``[fla, transformers]``: top-level import names, each once."""
    names = r.list_("requires")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not PACKAGE.match(name):
            r.fail(f"trainer.requires[{i}]", f"{name!r}: expected a top-level import name such as transformers "
                                            "(the package as `import` names it, not its pip name or a dotted module)")
        if name in names[:i]:
            r.fail(f"trainer.requires[{i}]", f"{name!r} is listed twice")
    return tuple(names)


def _tokens_per_step(r: Reader, params: Mapping[str, Delivery]) -> tuple[str | int, ...]:
    """``[train.batch_size, train.block_size]``: each factor a params key or an integer >= 1."""
    factors = r.list_("tokens_per_step")
    if not factors:
        r.fail("trainer.tokens_per_step", "an empty list multiplies to nothing; give the factors of one rank's "
                                          "tokens per step (params keys and integers), or leave the key out")
    for i, f in enumerate(factors):
        if isinstance(f, bool) or not (isinstance(f, int) and f >= 1 or isinstance(f, str) and f in params):
            r.fail(f"trainer.tokens_per_step[{i}]", f"{f!r}: expected a key of trainer.params "
                                                    f"({', '.join(sorted(params)) or 'none declared'}) or an integer >= 1")
    return tuple(factors)


def _resume(path: Path, data: Any, config: ConfigFile | None) -> ResumeSpec:
    r = Reader(path, data, "trainer.resume", keys.TRAINER_RESUME)
    return ResumeSpec(_delivery(path, r.get("stop_after"), "trainer.resume.stop_after", config),
                      _delivery(path, r.get("from"), "trainer.resume.from", config))


def _root(r: Reader) -> RootDir:
    """``root: some/dir`` (relative to this repository) or ``root: {env: VAR}``."""
    data = r.get("root")
    if isinstance(data, str):
        if data.startswith(("/", "~")) or ".." in Path(data).parts:  # a checkout elsewhere: the README's way
            r.fail(r.key("root"), f"{data!r} is outside this repository; name it through an environment variable: "
                                  "root: {env: MY_TRAINER_ROOT}, then export MY_TRAINER_ROOT=" + data)
        return RootDir(path=_relative(r, "root", data))
    env = Reader(r.path, data, "trainer.root", keys.TRAINER_ROOT)
    # the harness reads this variable and never sets it: any upper-case name will do
    return RootDir(env=env.str_("env", pattern=_ENV_NAME))


def _relative(r: Reader, key: str, v: str) -> str:
    """A path that stays under the directory it is relative to."""
    if not v or v.startswith(("/", "~")) or ".." in Path(v).parts or not set(v) <= _ARG_CHARS - {"{", "}"}:
        r.fail(r.key(key), f"{v!r} must be a relative path without '..' (letters, digits, _ . / -)")
    return v


def _arg(r: Reader, key: str, v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        r.fail(key, f"expected a string or number, got {v!r}")
    v = str(v)
    if not set(v) <= _ARG_CHARS:
        r.fail(key, f"{v!r} has characters not allowed in an argument (letters, digits, _ . : , + / @ = - and "
                    f"placeholders {', '.join('{' + p + '}' for p in PLACEHOLDERS)})")
    try:
        fields = [f for _, f, spec, conv in string.Formatter().parse(v) if f is not None or spec or conv]
    except ValueError as exc:
        r.fail(key, f"{v!r}: {exc}")
    bad = [f for f in fields if f not in PLACEHOLDERS]
    if bad:
        r.fail(key, f"unknown placeholder {{{bad[0]}}}; placeholders: {', '.join('{' + p + '}' for p in PLACEHOLDERS)}")
    return v


def _config(path: Path, data: Any) -> ConfigFile:
    r = Reader(path, data, "trainer.config", keys.TRAINER_CONFIG)
    template = _relative(r, "template", r.str_("template"))
    pass_as = _delivery(path, r.get("pass_as"), "trainer.config.pass_as", None) if "pass_as" in r.data else None
    if pass_as is not None and pass_as.via == Via.CONFIG:
        r.fail("trainer.config.pass_as", "the config's own path reaches the trainer by flag or env")
    return ConfigFile(template, pass_as)


def _delivery(path: Path, data: Any, where: str, config: ConfigFile | None) -> Delivery:
    if data is None:
        raise RunbookError(f"{path}: {where}: {EMPTY_MAPPING}: one of flag: --name, env: NAME, config: dotted.key")
    r = Reader(path, data, where, tuple(Via))
    if len(r.data) != 1:
        r.fail(where, "give exactly one of flag: --name, env: NAME, config: dotted.key")
    (via, name), = r.data.items()
    name = r.str_(via)
    if via == Via.FLAG and not _FLAG.match(name):
        r.fail(f"{where}.flag", f"{name!r} is not a flag like --steps")
    if via == Via.ENV:
        check_trainer_env_key(r, f"{where}.env", name)
    if via == Via.CONFIG:
        if config is None:
            r.fail(f"{where}.config", "a config key needs trainer.config (the template the harness copies)")
        if not _CONFIG_KEY.match(name):
            r.fail(f"{where}.config", f"{name!r} is not a dotted config key")
    return Delivery(Via(via), name)
