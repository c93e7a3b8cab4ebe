"""Scalars of TensorBoard event files, read without TensorBoard or protobuf installed.

An event file is a sequence of TFRecords (a little-endian u64 length, its u32 CRC, the payload,
the payload's u32 CRC), each payload one ``Event`` protocol buffer: ``wall_time`` (field 1,
double), ``step`` (2, varint) and ``summary`` (5), whose ``value``s (1) carry a ``tag`` (1) and a
``simple_value`` (2, float32: what ``SummaryWriter.add_scalar`` writes). Records are read in file
order; a record cut short at the end (a writer killed mid-write) ends the file. The CRCs are not
checked: a file whose bytes do not parse as records ends where they stop.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float
    wall_time: float


def events_where(events: list[Path], root: Path) -> str:
    """The event files as an adapter names what it read: "the TensorBoard events under runs/" (the
    folders of ``root`` that hold them, or the files themselves where they lie in ``root``)."""
    tops = sorted({path.relative_to(root).parts[0] + ("/" if path.parent != root else "") for path in events})
    return "the TensorBoard events " + ("under " if all(t.endswith("/") for t in tops) else "in ") + ", ".join(tops)


def read_scalars(path: Path) -> list[Scalar]:
    data = path.read_bytes()
    out: list[Scalar] = []
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            break  # cut off mid-record
        try:
            out += _event(data[start:end])
        except (IndexError, struct.error, UnicodeDecodeError):
            break  # not an event record: the file is not what its name says from here on
        pos = end + 4
    return out


def _fields(buf: bytes):
    """(field number, wire type, value) of each field of one message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise struct.error(f"wire type {wire}")
        yield number, wire, value


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _event(buf: bytes) -> list[Scalar]:
    wall, step, summaries = 0.0, 0, []
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 1:
            (wall,) = struct.unpack("<d", value)
        elif number == 2 and wire == 0:
            step = value if value < 1 << 63 else value - (1 << 64)
        elif number == 5 and wire == 2:
            summaries.append(value)
    out = []
    for summary in summaries:
        for number, wire, value in _fields(summary):
            if number != 1 or wire != 2:
                continue
            tag, scalar = None, None
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    tag = v.decode()
                elif n == 2 and w == 5:
                    (scalar,) = struct.unpack("<f", v)
            if tag is not None and scalar is not None:
                out.append(Scalar(tag, step, float(scalar), wall))
    return out
