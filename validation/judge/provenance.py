"""The commit a trainer ran at, as records, baselines, goldens and the report name it.

The trainer's own word first: ``git_sha`` in its env.json (contract v2). Else what the harness
found at the trainer's root before launching it (``nsa.provenance.source_revision`` there, which
trusts git only when the root is its repository's top level, never a repository that merely
contains it). This repository's commit is recorded beside it, never in its place.
"""
from __future__ import annotations

import re
from typing import Any

from nsa.contract import ENV_JSON

#: a revision names a commit: git describe's output or a hash, never words with spaces ('unknown
#: (git unavailable ...)' is what a trainer writes when it could not tell)
_REVISION = re.compile(r"^\S+$")
#: git describe --always --dirty --abbrev=40: '<hash>', 'v1-3-g<hash>', either with '-dirty'
_DESCRIBED = re.compile(r"(?:.*-g)?([0-9a-f]{7,40})(-dirty)?")
#: the suffix git describe --dirty adds for a tree with uncommitted changes
DIRTY = "-dirty"


def short_commit(sha: str) -> str:
    """A commit as the report names it: its hash to 12 digits, keeping git describe's '-dirty' (a
    tree with uncommitted changes on that commit): '5bb667bbc52a-dirty', never '5bb667bbc52a' for
    both the commit and its edited tree. Anything else (a tag alone) as it is."""
    m = _DESCRIBED.fullmatch(sha)
    return m.group(1)[:12] + (m.group(2) or "") if m else sha


def trainer_commit(env: dict[str, Any] | None, found: str | None,
                   found_source: str | None) -> tuple[str | None, str | None]:
    """(commit, where it came from): env.json's git_sha when it names a revision, else ``found``."""
    said = (env or {}).get("git_sha")
    if isinstance(said, str) and _REVISION.match(said):
        how = (env or {}).get("git_sha_source")
        return said, f"{ENV_JSON} git_sha" + (f" ({how})" if isinstance(how, str) and how else "")
    return found, found_source if found else None
