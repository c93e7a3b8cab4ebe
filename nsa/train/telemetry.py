"""The trainer's outputs read by the harness: training.csv (rank 0), heartbeat_rank{R}.jsonl
(every rank) and env.json (rank 0), plus per-stage profiler/NVTX ranges. File names, the CSV
header and the contract version come from nsa/contract.py, the schema the harness checks by.

training.csv: ``step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb``;
loss is the mean over ranks and micro-batches, toks_per_s is global (batch x seq_len x
grad_accum x world_size / step time), memory is CUDA allocator GiB (the process's resident set
size on CPU; env.json's memory_source says which).

heartbeat_rank{R}.jsonl, one JSON object per line, every record with time, rank, pid, node
(torchrun's node rank, GROUP_RANK), host, step, stage, mem_alloc_gb and the last logged
toks_per_s and gpu_util:
* stage records on entering data / forward / backward / optimizer / checkpoint, graph (one
  CUDA-graph replay of every micro-batch's forward and backward, train.cuda_graphs) and profile
  (rank 0 summarising a profiled window, train.profile_steps);
* a ``"stage": "step"`` record per logged step adding loss (global), loss_rank, lr,
  step_time_s, grad_norm, mem_reserved_gb, mem_peak_gb, toks_per_s_rank and, unless
  telemetry.disable_aux_stats, gates {cmp, sel, win} (mean gate per branch), routes
  {stage: {backend, calls}} and fallbacks {stage: calls routed after skipping a better backend};
* a ``"stage": "halt"`` record when the non-finite guard stops the run.
"""
from __future__ import annotations

import contextlib
import csv
import importlib.metadata
import json
import math
import os
import platform
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

import torch

from .. import contract
from ..provenance import source_revision
from . import strict_json
from nsa.atomic import write_atomic
from .checkpoint import CheckpointError

CSV_HEADER = list(contract.CSV_COLUMNS)
REPO_ROOT = Path(__file__).resolve().parents[2]
GB = 1024**3


def memory_source(device: torch.device) -> str:
    """What the memory columns measure on this device (recorded in env.json)."""
    return "torch.cuda allocator" if device.type == "cuda" else "process resident set size (CPU run)"


def _rss_bytes() -> tuple[float, float]:
    """This process's resident set size now and at its peak (Linux /proc; getrusage elsewhere)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE"), float(peak)
    except (OSError, ValueError, IndexError):
        return float(peak), float(peak)


def memory_gb(device: torch.device) -> dict[str, float]:
    """Allocated / reserved / peak-allocated CUDA memory in GiB; on CPU the process's resident set
    (allocated = reserved = RSS now, peak = peak RSS), so the memory gates measure something there
    too (they once passed on constant zeros).

    On CUDA from one read of the allocator's counters (``torch.cuda.memory_stats_as_nested_dict``):
    torch.cuda.memory_allocated, memory_reserved and max_memory_allocated each build and flatten the
    whole statistics dict in Python, and every stage's heartbeat reads this: three calls a stage
    are a visible share of a CUDA-graph step's host time (bash bench/gpu/host_stacks.sh shows it)."""
    if device.type != "cuda":
        rss, peak = _rss_bytes()
        return {"mem_alloc_gb": rss / GB, "mem_reserved_gb": rss / GB, "mem_peak_gb": peak / GB}
    return cuda_memory_gb(torch.cuda.memory_stats_as_nested_dict(device))


def device_memory_gb(device: torch.device) -> float | None:
    """One device's memory in GiB (env.json device_mem_gb: the harness projects when memory that keeps
    growing would run out): the GPU's, or on CPU the host's physical memory, which the resident set
    that mem_*_gb measures there is bounded by; None where it cannot be read."""
    if device.type == "cuda":
        return round(torch.cuda.get_device_properties(device).total_memory / GB, 3)
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB, 3)
    except (OSError, ValueError):
        return None


def cuda_memory_gb(stats: dict[str, Any]) -> dict[str, float]:
    """memory_gb's figures from the allocator's nested statistics (zeros before the allocator has
    counted anything, as torch.cuda.memory_allocated gives)."""
    allocated = stats.get("allocated_bytes", {}).get("all", {})
    reserved = stats.get("reserved_bytes", {}).get("all", {})
    return {"mem_alloc_gb": allocated.get("current", 0) / GB, "mem_reserved_gb": reserved.get("current", 0) / GB,
            "mem_peak_gb": allocated.get("peak", 0) / GB}


#: seconds between two readings of the GPU's utilisation: NVML reports it as the share of its own
#: sample period (1/6 s to 1 s, by the GPU) in which a kernel ran, so a run logging every step of
#: a few milliseconds would read the same figure again and again, each reading a driver call
#: inside the next step's time; between readings a logged step repeats the last one
UTIL_EVERY_S = 1.0


def gpu_util(device: torch.device) -> tuple[float | None, str]:
    """(utilisation %, '') or (None, why not)."""
    if device.type != "cuda":
        return None, "CPU run"
    try:
        return float(torch.cuda.utilization(device)), ""
    except (ModuleNotFoundError, RuntimeError) as exc:  # pynvml absent or NVML unusable
        return None, f"torch.cuda.utilization unavailable: {exc}"


def _step_of_row(line: bytes) -> int | None:
    """The step of a training.csv row (None for the header or a row without one)."""
    first = line.split(b",", 1)[0]
    return int(first) if first.isdigit() else None


def _step_of_record(line: bytes) -> int | None:
    """The step of a heartbeat record (None for a line that is not a record with one)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    step = rec.get("step") if isinstance(rec, dict) else None
    return step if isinstance(step, int) else None


def _keep_through_step(path: Path, keep_through_step: int, step_of: Callable[[bytes], int | None]) -> None:
    """Rewrite ``path`` without the lines of steps after ``keep_through_step`` and without a torn
    last line (a writer killed mid-line: appending after it would corrupt both). Streamed into a
    file beside it and swapped in (write_atomic): a crash mid-rewrite loses no earlier line, and a
    long run's heartbeat file is never read whole. Lines are filtered, not cut at the first later
    step: a profiled window logs its steps after running them, so a record of step N can follow
    one of step N + 1."""
    def copy(out: BinaryIO) -> None:
        with open(path, "rb") as src:
            for line in src:
                step = step_of(line)
                if line.endswith(b"\n") and (step is None or step <= keep_through_step):
                    out.write(line)

    write_atomic(path, copy)


def truncate_csv(path: Path, keep_through_step: int) -> None:
    """On resume: drop rows after the checkpoint's step (a crashed run may have logged more)."""
    if not path.exists():
        return
    with open(path, newline="") as fh:
        header = fh.readline().rstrip("\r\n").split(",")
    if header != CSV_HEADER:
        raise CheckpointError(f"{path}: unexpected header {header}, cannot resume into it "
                              f"(expected {','.join(CSV_HEADER)})")
    _keep_through_step(path, keep_through_step, _step_of_row)


def truncate_heartbeats(path: Path, keep_through_step: int) -> None:
    """On resume: drop this rank's records of steps after the checkpoint's, as truncate_csv does
    its rows; else the steps the resumed run does again appear twice."""
    if path.exists():
        _keep_through_step(path, keep_through_step, _step_of_record)


def ranks_gone(out_dir: Path, ranks: list[int], wait_s: float = 1.0, tail_bytes: int = 8192) -> list[int]:
    """Of ``ranks``, those whose process, as the last record of their heartbeat file names it (pid
    and host), ran on this host and has ended (gone, or a zombie not yet reaped). A rank on another
    host, without heartbeats, or whose pid is taken again is not among them: nothing here tells.
    A killed process closes its sockets before it ends, so a peer's broken collective may come
    first: the first of up to ``wait_s`` of looks that finds one ended answers (later, the ranks
    that fail on the broken collective end too)."""
    import psutil

    host, pids = socket.gethostname(), {}
    for rank in ranks:
        try:
            with open(Path(out_dir) / contract.heartbeat_name(rank), "rb") as fh:
                fh.seek(max(0, fh.seek(0, os.SEEK_END) - tail_bytes))
                lines = fh.read().splitlines()
            last = json.loads(lines[-1]) if lines else {}
        except (OSError, ValueError):  # none, or a line torn by the kill
            continue
        if isinstance(last, dict) and last.get("host") == host and isinstance(last.get("pid"), int):
            pids[rank] = last["pid"]

    def ended(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + wait_s
    while True:
        gone = [rank for rank, pid in pids.items() if ended(pid)]
        if gone or not pids or time.monotonic() >= deadline:
            return gone
        time.sleep(0.02)


@contextlib.contextmanager
def _naming(fh):
    """A failed write (a full disk) says which file: the OSError of a write to an open file has none."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, fh.name) from None


class OutputLost(RuntimeError):
    """A file the run appends to was deleted under it (its out_dir removed): what it writes from
    then on reaches no one, so the run stops rather than report success over files that are gone."""


class Telemetry:
    def __init__(self, out_dir: Path, rank: int, is_master: bool, device: torch.device,
                 heartbeat: bool, nvtx: bool, resume_step: int = 0):
        self.out_dir, self.rank, self.is_master, self.device = Path(out_dir), rank, is_master, device
        self.nvtx = nvtx and device.type == "cuda"
        self._csv = None
        if is_master:
            path = self.out_dir / contract.TRAINING_CSV
            if resume_step > 0:
                truncate_csv(path, resume_step)
            else:
                path.unlink(missing_ok=True)
            new = not path.exists()
            self._csv_fh = open(path, "a", newline="", buffering=1)
            self._csv = csv.writer(self._csv_fh)
            if new:
                self._csv.writerow(CSV_HEADER)
        # an earlier run's records past this run's start go whether or not this run writes any:
        # left there, they are read as this run's
        hb_path = self.out_dir / contract.heartbeat_name(rank)
        if resume_step == 0:
            hb_path.unlink(missing_ok=True)
        else:
            truncate_heartbeats(hb_path, resume_step)
        self._hb = open(hb_path, "a", buffering=1) if heartbeat else None
        self.util_reason = ""
        self._util: float | None = None
        self._util_read_at = -math.inf  # time.monotonic() of the last reading (UTIL_EVERY_S)
        # where this rank runs: the harness groups ranks by node (stragglers, a node's hang)
        self.place = {"node": int(os.environ.get(contract.NODE_RANK_ENV, "0")), "host": socket.gethostname()}
        # last logged values, repeated in every stage record so each heartbeat line is complete
        self.last: dict[str, Any] = {"toks_per_s": None, "gpu_util": None}

    def heartbeat(self, record: dict[str, Any]) -> None:
        if self._hb is not None:
            rec = {"time": time.time(), "rank": self.rank, "pid": os.getpid(), **self.place, **record}
            with _naming(self._hb):
                self._hb.write(strict_json.dumps(rec) + "\n")

    def stage_beat(self, step: int, name: str) -> None:
        """The heartbeat of entering a stage."""
        self.heartbeat({"step": step, "stage": name, "mem_alloc_gb": memory_gb(self.device)["mem_alloc_gb"],
                        **self.last})

    @contextlib.contextmanager
    def stage(self, step: int, name: str):
        """A training stage: heartbeat on entry, a torch.profiler range, an NVTX range if on."""
        self.stage_beat(step, name)
        if self.nvtx:
            torch.cuda.nvtx.range_push(f"train.{name}")
        try:
            with torch.profiler.record_function(f"train.{name}"):
                yield
        finally:
            if self.nvtx:
                torch.cuda.nvtx.range_pop()

    def log_step(self, row: dict[str, float], extra: dict[str, Any], garbled: bool = False) -> None:
        """One logged step: a training.csv row (rank 0) and a step heartbeat (every rank).
        ``garbled``: the row's tokens/s is written as a word (the malformed fault)."""
        self.check_linked()
        if self._csv is not None:
            cells = [f"{row[k]:.6g}" for k in CSV_HEADER[1:]]
            if garbled:
                cells[CSV_HEADER.index("toks_per_s") - 1] = "fast"
            with _naming(self._csv_fh):
                self._csv.writerow([row["step"], *cells])
        now = time.monotonic()
        if now - self._util_read_at >= UTIL_EVERY_S:
            self._util, self.util_reason = gpu_util(self.device)
            self._util_read_at = now
        self.last = {"toks_per_s": row["toks_per_s"], "gpu_util": self._util}
        self.heartbeat({"stage": "step", **row, **extra, "gpu_util": self._util})

    def check_linked(self) -> None:
        """Raise OutputLost when training.csv or this rank's heartbeat file no longer has a name."""
        for fh in (self._csv_fh if self._csv is not None else None, self._hb):
            if fh is not None and os.fstat(fh.fileno()).st_nlink == 0:
                raise OutputLost(f"{fh.name} was deleted while the run wrote it (was {self.out_dir} removed?); "
                                 "stopping, as the run's record from here on would be lost")

    def close(self) -> None:
        for fh in (self._csv_fh if self._csv is not None else None, self._hb):
            if fh is None:
                continue
            try:
                fh.close()
            except OSError as exc:
                # the flush of a line whose write already failed (a full disk) and raised: raised
                # again here, from the trainer's clean-up, it replaced that error and its traceback
                print(f"[rank {self.rank}] could not close {fh.name}: {exc}", file=sys.stderr, flush=True)


# --- env.json ---------------------------------------------------------------------------------


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, devices and source revision (collected once at start-up)."""
    cuda = torch.cuda.is_available()
    sha, sha_source = source_revision(REPO_ROOT, _git)
    return {
        "git_sha": sha,  # null when unknown (git_sha_source says why): never another repository's commit
        "git_sha_source": sha_source,
        "git_dirty": None if sha is None else sha.endswith("-dirty"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "triton": _version("triton"),
        "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def sdpa_flags() -> dict[str, bool]:
    b = torch.backends.cuda
    return {"flash": b.flash_sdp_enabled(), "mem_efficient": b.mem_efficient_sdp_enabled(), "math": b.math_sdp_enabled()}


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, (strict_json.dumps(data, indent=2, default=str) + "\n").encode())
