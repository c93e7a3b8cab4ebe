"""Readers for the trainer's output contract (DESIGN.md, "Trainer outputs").

Each reader takes an out_dir and returns plain data, or raises ArtifactError naming the file and
what is wrong with it. Nothing here interprets the numbers; metrics.py and findings.py do.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from .errors import ArtifactError

CSV_NAME = "training.csv"
CSV_COLUMNS = ["step", "loss", "lr", "toks_per_s", "step_time_s", "grad_norm", "mem_alloc_gb", "mem_reserved_gb"]
ENV_NAME = "env.json"
HALT_NAME = ".HALT"
_HEARTBEAT = re.compile(r"^heartbeat_rank(\d+)\.jsonl$")
_STACKDUMP = re.compile(r"^stackdump_rank(\d+)\.txt$")


def read_training_csv(out_dir: Path) -> pd.DataFrame:
    """training.csv as a DataFrame of floats (step as int), sorted by step.

    The header must be exactly the contract's; every value must parse as a number (``nan`` and
    ``inf`` parse, and the loss gate catches them)."""
    path = Path(out_dir) / CSV_NAME
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (the trainer wrote no {CSV_NAME})")
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        raise ArtifactError(f"{path}: empty file, expected header {','.join(CSV_COLUMNS)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not a readable CSV ({str(exc).strip()})") from None
    if list(df.columns) != CSV_COLUMNS:
        raise ArtifactError(f"{path}: header is {','.join(map(str, df.columns))}; expected {','.join(CSV_COLUMNS)}")
    out = pd.DataFrame()
    for col in CSV_COLUMNS:
        values = pd.to_numeric(df[col].str.strip(), errors="coerce")
        bad = values.isna() & ~df[col].str.strip().str.lower().isin(["nan"])
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            raise ArtifactError(f"{path}: row {row + 2}, column {col}: {df[col].iloc[row]!r} is not a number")
        out[col] = values.astype(float)
    if out.empty:
        raise ArtifactError(f"{path}: header only, no steps logged")
    out["step"] = out["step"].astype(int)
    return out.sort_values("step", kind="stable").reset_index(drop=True)


def window_rows(df: pd.DataFrame, last: int | None) -> pd.DataFrame:
    """The rows of the last ``last`` steps, counted in step numbers, not rows: a trainer that
    logs every 20 steps has 3 rows in 'last 50 steps' (all rows when last is None)."""
    return df if last is None or df.empty else df[df["step"] > df["step"].max() - last]


def read_heartbeats(out_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Per rank, the heartbeat records in file order. A torn last line (a killed writer) is
    skipped; any other undecodable line is an error naming file and line."""
    beats: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(Path(out_dir).glob("heartbeat_rank*.jsonl")):
        m = _HEARTBEAT.match(path.name)
        if not m:
            continue
        lines = path.read_text(errors="replace").splitlines()
        records = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break
                raise ArtifactError(f"{path}: line {i + 1} is not JSON") from None
            if isinstance(rec, dict):
                records.append(rec)
        beats[int(m.group(1))] = records
    return beats


def read_env_json(out_dir: Path) -> dict[str, Any] | None:
    path = Path(out_dir) / ENV_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data


def stackdumps(out_dir: Path) -> dict[int, Path]:
    out = {}
    for path in sorted(Path(out_dir).glob("stackdump_rank*.txt")):
        m = _STACKDUMP.match(path.name)
        if m:
            out[int(m.group(1))] = path
    return out


def halted(out_dir: Path) -> bool:
    return (Path(out_dir) / HALT_NAME).exists()


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")


def parse_stackdump(text: str) -> list[dict[str, Any]]:
    """faulthandler output -> threads, each {thread, current, frames: [{file, line, func}]},
    frames most recent first (faulthandler's order)."""
    threads: list[dict[str, Any]] = []
    for line in text.splitlines():
        t = _THREAD.match(line)
        if t:
            threads.append({"thread": t.group(2), "current": t.group(1) == "Current thread", "frames": []})
            continue
        f = _FRAME.match(line)
        if f:
            if not threads:
                threads.append({"thread": "?", "current": False, "frames": []})
            threads[-1]["frames"].append({"file": f["file"], "line": int(f["line"]), "func": f["func"]})
    return threads


def main_thread_frames(threads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The frames of the thread that ran the training loop: the one whose outermost frame is
    a module's top level (``<module>``), else the longest stack. Watchdog threads are skipped."""
    if not threads:
        return []
    with_module = [t for t in threads if t["frames"] and t["frames"][-1]["func"] == "<module>"]
    pool = with_module or threads
    return max(pool, key=lambda t: len(t["frames"]))["frames"]
