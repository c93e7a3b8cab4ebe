"""Whole-file writes that no reader ever sees half done, and that a failed write (a full disk,
a signal) leaves as they were, with no temp file behind.

A leaf module (the standard library only): the trainer (nsa/train) and the harness (validation/),
which never imports the trainer it judges, both write through it."""
from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: Path, content: str | bytes | Callable[[BinaryIO], object], *, mode: int | None = None) -> None:
    """Write ``content`` (text as UTF-8, bytes, or a function writing to the open binary file) into
    a temp file beside ``path``, fsync it, rename it over ``path`` and fsync the directory: without
    the directory's fsync the rename may not survive a power cut (POSIX), and after one ``latest``
    could name the checkpoint before, or a file pruned since (a killed process is fine either way).
    ``mode``: the file's permissions whatever the umask (the harness's outputs are for everyone)."""
    path = Path(path)
    if isinstance(content, str):
        content = content.encode()
    # the thread too: the watchdog's thread writes env.json while the main thread may be writing it
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            if isinstance(content, bytes):
                fh.write(content)
            else:
                content(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a half-written temp file would hold the space a full disk lacks
        if isinstance(exc, OSError) and exc.filename is None:  # a write's or close's: it names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make a rename into ``folder`` durable. Where directories cannot be opened (Windows) or
    their fsync is not supported (EINVAL, ENOTSUP: some network filesystems) there is nothing to
    do; another failure (EIO) is raised."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        if os.name == "nt":
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)
