"""An exclusive lock held over a read-modify-write of a file that is replaced atomically (the
result store, a golden file): the lock is taken on a file of its own beside it, since a rename
over the locked file would leave the next writer locking a new inode while the first still holds
the old one."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

#: why a lock file that exists may refuse to be opened for writing: another user's (made under
#: their umask), immutable, or on a read-only file system
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``lock_path`` (created, with its folder, where missing);
    another process, or another open of it in this one, waits until it is released. The kernel
    releases it when its holder dies, even by SIGKILL. A lock file this process may not write is
    opened to read: flock locks the open file whatever its access mode, so a report can still be
    rendered from a results directory whose lock file another user made."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        if exc.errno not in _NOT_WRITABLE:
            raise
        try:
            fd = os.open(lock_path, os.O_RDONLY)
        except OSError:
            raise exc from None  # it cannot be made either: the reason it could not be written
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
