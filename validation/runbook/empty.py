"""What the loader says about a key written with nothing after it, and about a key that landed
outside its section.

YAML reads ``launcher:`` (or ``env:``, ``gates:``, ``steps:``) with nothing after it or indented
under it as null. That is no shorthand for the key's default (leaving the line out is): whoever
wrote the line meant a value or keys to follow, and commented them out or did not indent them,
so the keys meant for the section land one level up (an unknown key there) or are lost. An empty
key is therefore an error naming the file, the key path and what was expected, except the keys
whose ``Key.empty`` says what an empty value means (texts for people). The same reasoning as the
trainer's own config loader (nsa/config.py, ``not_a_section``).
"""
from __future__ import annotations

import re

from validation.runbook import keys

_DOTTED = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def empty_key(leaf: str, meaning: str = "", required: bool = False) -> str:
    """The message for key ``leaf`` of a mapping, present with no value; ``meaning`` is what the
    key is for (its row in validation/runbook/keys.py) where a section describes the mapping."""
    expected = f"expected a value for it ({leaf}: {meaning})" if meaning else "expected a value for it"
    default = "; it is required" if required else ", or leave the line out for its default"
    return (f"empty (`{leaf}:` with nothing after it or indented under it, which YAML reads as null); {expected}; "
            f"give it (a section's keys indented under it){default}")


#: the message for a mapping that is null where its parent is no section of the loader's (a
#: delivery under trainer.params)
EMPTY_MAPPING = ("empty (nothing after the key or indented under it, which YAML reads as null); expected a mapping "
                 "of its keys")


def empty_item(where: str) -> str:
    """The message for a list item that is null (``-`` with nothing after it)."""
    return ("empty list item (`-` with nothing after it, which YAML reads as null); expected a mapping of its keys "
            "on the same line or indented under the `-`; remove the line if no item was meant")


#: the message for a null value in a free mapping (``overrides``, ``env``) or a sweep's list
EMPTY_SCALAR = ("empty value (nothing after the key, or a `-` with nothing after it, which YAML reads as null); "
                "expected a number, a boolean or a string (\"\" for an empty string); leave the key out to keep the "
                "trainer's own default")


def _section_name(section: keys.Section) -> str:
    return "the top level" if section.where.startswith("(") else section.where


def misplaced(name: object, here: keys.Section | None, allowed: tuple[str, ...]) -> str:
    """Where an unknown key ``name`` belongs, when it is a key of another section (mis-indented),
    or an override or environment variable written outside ``overrides:`` / ``env:``; "" when it
    is no key anywhere (a typo: the allowed keys say the rest)."""
    if not isinstance(name, str):
        return ""
    if _DOTTED.match(name) and "overrides" in allowed:
        return " (a dotted config key: indent it under overrides:, or under sweep: with a list of values)"
    if _ENV_NAME.match(name) and "env" in allowed:
        return " (an environment variable: indent it under env:)"
    if here is keys.TRAINER and name == "adapter":
        return " (the reader of its files is format: contract, the default, seed, torchtitan or hf_trainer)"
    files = (keys.PROFILE, keys.HARDWARE)
    family = files if here in files else tuple(s for s in keys.SECTIONS if s not in files)
    homes = [_section_name(s) for s in family if s is not here and name in s.names]
    return f" (a key of {' or '.join(homes)}: indented wrongly?)" if homes else ""
