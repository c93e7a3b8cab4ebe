"""Typed configuration: YAML -> nested dataclasses, with dotted overrides.

Every config section is a dataclass whose fields carry defaults and whose ``__post_init__``
rejects bad values with a ``ValueError`` naming the key. This module only knows how to move
plain data (dicts from YAML, ``key.sub=value`` strings) into such dataclasses:

* unknown keys are rejected, naming the full dotted key and the keys that are allowed;
* values are coerced to the field's declared type (``"512"`` -> 512 for an ``int`` field,
  ``"true"``/``"1"`` -> True for a ``bool``), and a value that cannot be coerced is an error;
* YAML is always read with ``yaml.safe_load``'s loader, a key written twice in one mapping being an
  error naming it, its section and both lines (nsa/yaml_unique.py), never the last value kept.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from .yaml_unique import DuplicateKeyError, safe_load_unique

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file, key or value is wrong; the message names the key (and file when known)."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(value: Any, typ: Any, key: str, root: type) -> Any:
    origin = typing.get_origin(typ)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(value, args[0], key, root)
    if origin in (list, tuple):
        (inner, *_rest) = typing.get_args(typ) or (Any,)
        if isinstance(value, str):
            value = [v for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, inner, key, root) for v in value]
    if origin is dict or typ is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if typ is Any:
        return value
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ConfigError(f"{key}: expected a boolean, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if typ is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        number = None
        if isinstance(value, (int, float)):
            number = float(value)
        elif isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                pass
        # nan passes every range check (all its comparisons are false); inf means no setting here
        if number is None or not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if typ is str:
        if isinstance(value, bool):  # YAML reads on/off/yes/no as booleans; the field's check judges
            return "true" if value else "false"
        if isinstance(value, (str, int, float)):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if dataclasses.is_dataclass(typ):
        return from_dict(typ, value, prefix=key, root=root)
    return value


def not_a_section(key: str, value: Any) -> ConfigError:
    """The error for a section ``key`` whose value is not a mapping of its keys. An empty section
    (``train:`` with nothing indented under it) is YAML's null; it is no shorthand for the
    section's defaults (leaving the section out is), since a user who wrote it meant keys to follow
    and commented them out or did not indent them."""
    if value is None:
        leaf = key.rsplit(".", 1)[-1]
        return ConfigError(f"{key}: expected a mapping of its keys, got an empty section (`{leaf}:` with nothing "
                           "indented under it, which YAML reads as null); indent its keys under it, or leave the "
                           "line out for the section's defaults")
    return ConfigError(f"{key}: expected a mapping, got {value!r}")


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """A config dataclass's field types, resolved once: its annotations are strings (postponed
    evaluation), and resolving them per call was most of a thousand-point runbook's check."""
    return typing.get_type_hints(cls)


def _homes(cls: type, name: str, prefix: str = "") -> list[str]:
    """The dotted keys below ``cls`` whose last part is ``name`` (where a mis-indented key belongs)."""
    hints = _hints(cls)
    found = []
    for f in dataclasses.fields(cls):
        if f.init and dataclasses.is_dataclass(hints[f.name]):
            section = f"{prefix}{f.name}."
            sub = {g.name for g in dataclasses.fields(hints[f.name]) if g.init}
            found += [f"{section}{name}"] if name in sub else []
            found += _homes(hints[f.name], name, section)
    return found


def _unknown_keys(root: type, unknown: list[str], prefix: str, allowed: Iterable[str]) -> ConfigError:
    """Every unknown key of one mapping, the keys allowed there and, for a key of another section
    of the whole config ``root`` (``steps`` of a ``train:`` whose keys were not indented, or put
    under ``model:``), that section's key."""
    where = f"{prefix}." if prefix else ""
    keys = ", ".join(f"{where}{k}" for k in unknown)
    homes = [f"{k} is {' or '.join(_homes(root, k))}" for k in unknown if _homes(root, k)]
    hint = f"; in the wrong section? {', '.join(homes)}" if homes else ""
    return ConfigError(f"unknown config key{'s' if len(unknown) > 1 else ''} {keys}; allowed keys under "
                       f"{prefix or 'the top level'}: {', '.join(sorted(allowed))}{hint}")


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "", root: type | None = None) -> T:
    """Build dataclass ``cls`` from a mapping, recursing into nested dataclass fields; ``root`` is
    the whole config's class (default ``cls``), where an unknown key's right section is looked up."""
    root = root or cls
    if not isinstance(data, Mapping):
        raise not_a_section(prefix or cls.__name__, data)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in set(data) - set(fields))
    if unknown:
        raise _unknown_keys(root, unknown, prefix, fields)
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key, root)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{prefix + ': ' if prefix else ''}{exc}") from exc


def field_paths(cls: type) -> set[str]:
    """Every settable dotted key of a (nested) config dataclass: {'train.seq_len', ...}."""
    hints = _hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            out |= {f"{f.name}.{sub}" for sub in field_paths(hints[f.name])}
        else:
            out.add(f.name)
    return out


def to_dict(obj: Any) -> dict[str, Any]:
    """The plain-data form of a config dataclass (for env.json, checkpoints, YAML)."""
    return dataclasses.asdict(obj)


_OVERRIDE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*=")


def parse_overrides(items: list[str] | str | None) -> dict[str, Any]:
    """Turn ``["train.seq_len=512", "model.n_layers=2"]`` (or one space-separated string, as the
    seed runbooks pass to ``--override``) into a nested dict of raw string values. An item of
    several ``key=value`` words is several overrides; one whose words after the first are not
    ``key=`` is a single value holding a space (``train.out_dir=/data/my runs``). A key given
    twice with two values is an error naming both (``disagree``); twice with one value is fine."""
    if items is None:
        return {}
    if isinstance(items, str):
        items = items.split()
    nested: dict[str, Any] = {}
    for item in items:
        words = item.split()
        for part in words if all(_OVERRIDE_KEY.match(w) for w in words) else [item.strip()]:
            if "=" not in part:
                raise ConfigError(f"override {part!r}: expected key.path=value")
            key, value = part.split("=", 1)
            if not key or any(not k for k in key.split(".")):
                raise ConfigError(f"override {part!r}: empty key")
            node = nested
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"override {part!r}: {p} is already a value")
            if isinstance(node.get(leaf), dict):
                raise ConfigError(f"override {part!r}: earlier overrides set keys under {key}")
            if leaf in node and node[leaf] != value:  # the last one won without a word
                raise disagree(f"the overrides {key}={node[leaf]}", f"{key}={value}")
            node[leaf] = value
    return nested


def disagree(first: str, second: str) -> ConfigError:
    """The error for two settings of one key that disagree (a key overridden twice, a flag and an
    override of its key, --config and $CONFIG), naming both: whichever came last used to win
    without a word."""
    return ConfigError(f"{first} and {second} disagree: give one of them")


def merge(base: Mapping[str, Any], update: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base`` (update wins). A section of ``base`` that is a
    value where ``update`` has keys under it (``train: 5``, or an empty ``train:``, and
    ``train.steps=1``) is an error: the override would drop it unseen."""
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(out[k], v, f"{prefix}{k}.")
        elif isinstance(v, Mapping) and k in out:
            raise not_a_section(f"{prefix}{k}", out[k])
        else:
            out[k] = v
    return out


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> Any:
    """A YAML text's value, parsed once: a runbook's --check-config loads the same config file for
    each of its points (a thousand-point sweep, a thousand parses of one file)."""
    return safe_load_unique(text)


def read_yaml(path: str | Path, sections: Iterable[str] = ()) -> dict[str, Any]:
    """Read a YAML mapping with ``safe_load``; errors name the file and, when given, the
    ``sections`` a mapping of it holds. An empty file (or one of comments only) is an error, not
    an empty mapping: a config file passed on purpose and left empty meant every default, the
    125M model among them, without a word."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        data = copy.deepcopy(_parsed(text))  # a copy: the caller may change its mapping
    except DuplicateKeyError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from None
    expected = "a mapping at the top level" + (f" (sections: {', '.join(sections)})" if sections else "")
    if data is None:
        raise ConfigError(f"{path}: the file holds no settings (empty, or comments only); expected {expected}")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected {expected}, got {type(data).__name__}")
    return data


PRESET_DIR = Path(__file__).parent / "configs"


def resolve_config_path(name_or_path: str | Path, cwd: str | Path | None = None) -> Path:
    """A preset name (``m7c_125m``) or a path to a YAML file. The seed runbook's path of a preset,
    ``configs/<preset>.yaml`` (relative, absent here), is that preset; any other path that does not
    exist is an error, never a preset of the same name (``/home/me/exp/tiny.yaml`` mistyped trained
    the built-in tiny without a word). ``cwd``: the directory a relative path is read from (the
    trainer's working directory, for a caller that checks a path before launching it); None: this
    process's."""
    p = Path(name_or_path)
    here = p if cwd is None else Path(cwd) / p
    if p.suffix in (".yaml", ".yml") and here.exists():
        return here
    preset = PRESET_DIR / f"{p.stem}.yaml"
    if preset.exists() and (p == Path(p.name) or p.parent == Path(PRESET_DIR.name)):
        return preset
    if p.suffix in (".yaml", ".yml"):
        raise ConfigError(f"{p}: config file not found (presets: {', '.join(list_presets())})")
    if here.exists():  # a path the user meant as a config, not a preset's name
        raise ConfigError(f"{p}: not taken as a config file: expected a YAML path ending in .yaml or .yml, or a "
                          f"preset name ({', '.join(list_presets())})")
    raise ConfigError(f"unknown config preset {str(name_or_path)!r}; presets: {', '.join(list_presets())}")


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))
