"""The default real text (``data.dataset=text`` without ``data.path``): the Python standard
library's own ``.py`` source files, which every machine that runs this trainer has.

Found at run time (``sysconfig.get_paths()["stdlib"]`` of the running interpreter), read in place
(nothing downloaded, nothing copied into the repository), in a deterministic order: sorted by
path relative to the library's directory. Third-party packages that some installations keep under
that directory (``site-packages``, ``dist-packages``) are not the standard library and are not
walked; neither are ``__pycache__`` directories. Symbolic links to directories are not followed.
env.json records the directory and the number of files (``data`` in env.json).
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path, PurePath

#: directories under the standard library's that hold something else
NOT_STDLIB = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class StdlibCorpus:
    root: Path
    """The standard library's directory."""
    files: tuple[str, ...]
    """Its .py files, relative to ``root`` (POSIX separators), sorted."""

    @classmethod
    def find(cls, root: Path | None = None) -> "StdlibCorpus":
        """The corpus under ``root`` (default: the running interpreter's standard library)."""
        root = Path(sysconfig.get_paths()["stdlib"] if root is None else root)
        found = []
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = [d for d in subdirs if d not in NOT_STDLIB]
            rel = PurePath(os.path.relpath(directory, root))
            found += [(rel / n).as_posix().removeprefix("./") for n in names if n.endswith(".py")]
        return cls(root, tuple(sorted(found)))

    def paths(self) -> list[Path]:
        return [self.root / f for f in self.files]

    def describe(self) -> str:
        return f"the Python standard library's .py sources under {self.root} ({len(self.files)} files, read in place)"
