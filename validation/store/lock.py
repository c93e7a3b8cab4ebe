"""An exclusive lock held over a read-modify-write of a file that is replaced atomically (the
result store, a golden file): the lock is taken on a file of its own beside it, since a rename
over the locked file would leave the next writer locking a new inode while the first still holds
the old one."""
from __future__ import annotations

import contextlib
import fcntl
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive ``fcntl`` lock on ``lock_path`` (created, with its folder, where missing);
    another process, or another open of it in this one, waits until it is released. The kernel
    releases it when its holder dies, even by SIGKILL."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
