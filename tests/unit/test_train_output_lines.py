"""The trainer's printed lines each leave in one write (nsa.train.cli.whole_lines): under
PYTHONUNBUFFERED a line's text and newline went out apart, and torchrun's agent once wrote its
own line between them, on rank 0's "lost rank 2 ..." line (seen in CPU CI, three ranks)."""
from __future__ import annotations

import io
import sys

from nsa.train.cli import whole_lines


class _Writes(io.RawIOBase):
    def __init__(self):
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        self.calls.append(bytes(b))
        return len(b)


def test_a_printed_line_is_one_write_under_pythonunbuffered(monkeypatch):
    raw = _Writes()
    # what python -u (PYTHONUNBUFFERED) gives: an unbuffered binary layer, text written through
    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(raw, write_through=True))
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(_Writes(), write_through=True))
    whole_lines()
    print("[rank 0] lost rank 2 (process gone) at step 3", file=sys.stderr, flush=True)
    print("[rank 0] and a second line", file=sys.stderr)
    assert raw.calls == [b"[rank 0] lost rank 2 (process gone) at step 3\n", b"[rank 0] and a second line\n"]
