"""Whole-file writes that no reader ever sees half done, and that a failed write (a full disk,
a signal) leaves as they were, with no temp file behind."""
from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: Path, content: bytes | Callable[[BinaryIO], object]) -> None:
    """Write ``content`` (bytes, or a function writing to the open file) into a temp file beside
    ``path``, flush it to disk and rename it over ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            if isinstance(content, bytes):
                fh.write(content)
            else:
                content(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a half-written temp file would hold the space a full disk lacks
        raise
