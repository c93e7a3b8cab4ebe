"""Which commit a tree holds, for env.json and the acceptance report.

git answers (``describe --always --dirty``) unless a SOURCE_SHA stamp names a commit that git's
HEAD does not contain. The stamp is written with
``git describe --always --dirty --abbrev=40 > SOURCE_SHA`` before a tree is copied to a GPU box
without its repository; a box that kept an earlier copy's .git once answered an old commit over
a fresh stamp, so a repository whose history lacks the stamp's commit is taken to be stale. A
stamp whose commit HEAD does contain is left over from an earlier copy, and git wins.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

SOURCE_STAMP = "SOURCE_SHA"

#: git(*args) -> its stdout stripped, or None when git cannot run or exits non-zero
GitRunner = Callable[..., "str | None"]


def source_revision(root: Path, git: GitRunner) -> tuple[str | None, str]:
    """(the revision, where that answer came from); the revision is None when neither git nor a
    stamp names one."""
    described = git("describe", "--always", "--dirty", "--abbrev=40") or ""
    stamp_file = root / SOURCE_STAMP
    stamp = stamp_file.read_text().strip() if stamp_file.is_file() else ""
    if not stamp or stamp == described:
        return described or None, "git describe" + (f" (= {SOURCE_STAMP})" if stamp else "")
    if not described:
        return stamp, f"{SOURCE_STAMP} (git cannot answer here)"
    commit = re.search(r"[0-9a-f]{40}", stamp)
    if git("merge-base", "--is-ancestor", commit.group(0) if commit else stamp, "HEAD") is not None:
        return described, f"git describe ({SOURCE_STAMP} {stamp} is an older commit of this history)"
    return stamp, (f"{SOURCE_STAMP} (git here says {described}, whose history lacks the stamp's commit: "
                   "a stale repository beside a newer tree)")
