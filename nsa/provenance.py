"""Which commit a tree holds, for env.json and the acceptance report.

git answers (``describe --always --dirty``) only for a tree that is its repository's top level
(``rev-parse --show-toplevel`` is the tree itself): a trainer exported into a directory of
another repository would otherwise be reported at that other repository's commit. Where git
does not answer for the tree, the SOURCE_SHA stamp does, else nothing.

The stamp is written with ``git describe --always --dirty --abbrev=40 > SOURCE_SHA`` before a tree
is copied to a GPU box without its repository. A stamp naming a commit that git's HEAD does not
contain wins over git: a box that kept an earlier copy's .git once answered an old commit over a
fresh stamp, so a repository whose history lacks the stamp's commit is taken to be stale. A stamp
whose commit HEAD does contain is left over from an earlier copy, and git wins.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

SOURCE_STAMP = "SOURCE_SHA"

#: git(*args) -> its stdout stripped, or None when git cannot run or exits non-zero; it runs in
#: the tree whose commit is asked for
GitRunner = Callable[..., "str | None"]


def _same_directory(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def source_revision(root: Path, git: GitRunner) -> tuple[str | None, str]:
    """(the revision, where that answer came from); the revision is None when neither git (for
    ``root`` itself) nor a stamp names one."""
    described = git("describe", "--always", "--dirty", "--abbrev=40") or ""
    foreign = ""  # what git answered for, when that is a repository that merely contains root
    if described:
        top = git("rev-parse", "--show-toplevel")
        if top is None or not _same_directory(Path(top), Path(root)):
            foreign = f"git here answers for the repository at {top or 'an unknown top level'}, which only contains {root}"
            described = ""
    stamp_file = Path(root) / SOURCE_STAMP
    stamp = stamp_file.read_text().strip() if stamp_file.is_file() else ""
    if not stamp and not described:
        return None, (f"none: {foreign}, and there is no {SOURCE_STAMP} stamp" if foreign else
                      f"none: git cannot answer here and there is no {SOURCE_STAMP} stamp")
    if not stamp or stamp == described:
        return described, "git describe" + (f", as {SOURCE_STAMP} says" if stamp else "")
    if not described:
        return stamp, f"{SOURCE_STAMP}: {foreign or 'git cannot answer here'}"
    commit = re.search(r"[0-9a-f]{40}", stamp)
    if git("merge-base", "--is-ancestor", commit.group(0) if commit else stamp, "HEAD") is not None:
        return described, f"git describe; {SOURCE_STAMP} names {stamp}, an older commit of this history"
    return stamp, (f"{SOURCE_STAMP}; git here says {described}, whose history lacks the stamp's commit: "
                   "a stale repository beside a newer tree")
