"""One declaration per runbook key: a field of a frozen dataclass of validation/runbook/types.py made
by ``key(...)``, which holds its default, how the loader checks a value, its meaning for people,
whether ``defaults:`` may set it for every phase, and what a change to it since a stored run means.

Everything else reads these declarations: the sections of validation/runbook/keys.py (the keys a
mapping allows and requires), the loader's defaults and value checks (validation/runbook/load.py,
fields.py ``Reader.value``), the reference page docs/runbook_format.md (validation/report/reference.py)
and the staleness check of stored records (validation/store/stale.py).
"""
from __future__ import annotations

import dataclasses
import enum
import re
import typing
from dataclasses import dataclass
from typing import Any

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: a top-level import name (a package or module, no dots)
PACKAGE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: what an empty text for people means
TEXT_ONLY = "no text (a key for people only: nothing the harness does depends on it)"


class Stale(enum.Enum):
    """What a change to a key since a stored run means for that record (validation/store/stale.py)."""

    EXACT = "any change"
    """Any change: the stored run is no result of the point the runbook asks now."""
    ALLOWANCE = "where it may change how the run ended"
    """A time allowance: raised, it changes a run it may have ended (``Key.limit`` says which runs
    those are); lowered, a run that did not fail and took longer than the new allowance."""
    MORE = "more than the run made"
    """Only more than the run made: fewer keep it (each run was judged)."""
    ADDED = "asked now and not at the run (of a passed point)"
    """Only one asked now that the run was not asked, of a passed point: one that changed is re-checked
    from what is stored."""
    THROUGH = "through other keys"
    """Compared through other keys (``Key.note`` says which)."""
    NEVER = "never"
    """It does not change what a run measures (``Key.note`` says why)."""


class Limit(enum.Enum):
    """What a time allowance (``Stale.ALLOWANCE``) ends; its value: the stored runs a raised
    allowance may have ended."""

    RUN = "one that timed out"
    """The whole point."""
    QUIET = "one stopped as stalled after less quiet than the new allowance"
    """A quiet spell after a step (the stall watch, validation/launch/watch.py)."""
    START = "one stopped as stalled before any step"
    """The time before the first step (the stall watch)."""
    JOIN = "one that failed before its first step"
    """The rendezvous of the nodes of a launch of several."""


_KEY = "runbook_key"


@dataclass(frozen=True)
class Key:
    """One key of a runbook or profile mapping."""

    name: str
    meaning: str
    required: bool = False
    empty: str = ""
    """What the key written with nothing after it (YAML's null) means; "" (most keys): an error
    naming the file and key, since the user meant a value or keys to follow (validation/runbook/empty.py)."""
    default: Any = None
    """The value a mapping without the key takes (None: none, or one that depends on other keys)."""
    type: type | None = None
    """int, float or str: a scalar ``Reader.value`` checks; None: a key its section's parser reads."""
    minimum: float | None = None
    pattern: re.Pattern | None = None
    choices: tuple[str, ...] | None = None
    defaults: str | None = None
    """Its meaning under ``defaults:`` (every phase takes it unless it sets its own); None: not a
    key of ``defaults:``."""
    stale: Stale | None = None
    """What a change since a stored run means (a phase's keys); None: not a key of a stored point."""
    limit: Limit | None = None
    """What the allowance ends (``Stale.ALLOWANCE``)."""
    note: str = ""
    """Why it is compared the way it is (``Stale.THROUGH``, ``Stale.NEVER``)."""

    @property
    def shown_default(self) -> str:
        """The default as the reference page shows it ('' where there is none to show)."""
        if self.required or self.default is None or isinstance(self.default, bool):
            return ""
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default) if isinstance(self.default, (int, str)) and self.default != "" else ""

    @property
    def staleness(self) -> str:
        """What a change since a stored run means, in words for the reference page."""
        if self.stale is None:
            return ""
        text = self.stale.value
        if self.limit is not None:
            text += (f": raised, a run it may have ended ({self.limit.value}); lowered, a run that did not fail "
                     "and took longer than the new allowance")
        return f"{text}: {self.note}" if self.note else text


def key(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, meaning: str,
        **spec: Any) -> Any:
    """A dataclass field that is a runbook key: ``default`` (or ``factory``) is the value without
    it; ``spec`` holds the rest of ``Key`` (its name and default come from the field)."""
    return dataclasses.field(default=default, default_factory=factory, metadata={_KEY: (meaning, spec)})


def keys_of(cls: type) -> tuple[Key, ...]:
    """The runbook keys a dataclass declares, in field order (fields not made by ``key`` are not keys)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if _KEY not in f.metadata:
            continue
        meaning, spec = f.metadata[_KEY]
        default = None if f.default is dataclasses.MISSING else f.default
        out.append(Key(f.name, meaning, default=default, type=_scalar_type(hints[f.name]), **spec))
    return tuple(out)


def _scalar_type(hint: Any) -> type | None:
    """int, float or str of a field typed so (or Optional so); None for anything else."""
    args = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_args(hint) else [hint]
    return args[0] if len(args) == 1 and args[0] in (int, float, str) else None
