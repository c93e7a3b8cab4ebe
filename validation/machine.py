"""What this machine is: ``Machine`` (stored in every record) and ``detect()``; and how busy other
work kept it while a point ran: ``MachineLoad`` (measured by validation/launch/load.py)."""
from __future__ import annotations

import glob
import importlib.util
import math
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Machine:
    hostname: str = "?"
    python: str = "?"
    torch: str | None = None
    cuda: str | None = None
    cpu_count: int | None = None
    gpu_names: tuple[str, ...] = ()
    gpu_mem_gb: tuple[float, ...] = field(default=())

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def accelerator(self) -> str:
        return "cuda" if self.gpu_names else "cpu"

    def describe(self) -> str:
        if self.gpu_names:
            return f"{self.gpu_count}x {', '.join(sorted(set(self.gpu_names)))} ({min(self.gpu_mem_gb)} GiB)"
        return f"CPU only ({self.cpu_count} cores)"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Machine:
        """A record's stored machine (gpu_count and accelerator, once stored too, are derived)."""
        return cls(str(data.get("hostname", "?")), str(data.get("python", "?")), data.get("torch"), data.get("cuda"),
                   data.get("cpu_count"), tuple(data.get("gpu_names") or ()), tuple(data.get("gpu_mem_gb") or ()))


#: the machine's cores count as saturated from this fraction of them busy on average
SATURATED = 0.9
#: other work counts from this fraction of the cores (a fifth of a core on two): below it, on a
#: saturated machine, the point's own processes were what kept it busy
OTHERS_FRACTION = 0.1


@dataclass(frozen=True)
class MachineLoad:
    """The CPU use of the cores a point's processes could run on, averaged over its run: all of it,
    and the part of it outside the harness and what it launched (other users, another test run).
    A speed measured while others took cores the point needed says as much about them as about
    the trainer."""

    cores: int
    """The cores the harness (and what it launched) may run on."""
    busy_cores: float
    """Cores in use on average over the run, by anything."""
    others_cores: float
    """Of those, cores used by processes outside the harness and what it launched."""

    @property
    def ours_cores(self) -> float:
        """Cores the harness and what it launched used on average."""
        return max(self.busy_cores - self.others_cores, 0.0)

    @property
    def busy(self) -> bool:
        """Others competed with the point for the cores: the machine was saturated and others held a
        share of it (on a machine with cores to spare, others' work takes none from the point). A
        point that mostly waits (on a device, on sleep) is slowed too: a trainer spending a quarter of
        each step on the CPU lost 16% beside two busy processes on two cores."""
        return self.busy_cores >= SATURATED * self.cores and self.others_cores >= OTHERS_FRACTION * self.cores

    @property
    def slowdown(self) -> float:
        """The most other work can have slowed the point: alone, its processes could have used every
        core, and they used ``ours_cores`` (1 where the machine was not busy)."""
        if not self.busy:
            return 1.0
        return self.cores / self.ours_cores if self.ours_cores > 0 else math.inf

    def describe(self) -> str:
        """'other processes used 1.40 of the 2 cores on average (2.00 in use in all, 0.60 by the point's)'."""
        return (f"other processes used {self.others_cores:.2f} of the {self.cores} cores on average "
                f"({self.busy_cores:.2f} in use in all, {self.ours_cores:.2f} by the point's)")

    @classmethod
    def from_json(cls, data: Any) -> MachineLoad | None:
        if not isinstance(data, dict):
            return None
        return cls(int(data["cores"]), float(data["busy_cores"]), float(data["others_cores"]))

    @staticmethod
    def busiest(loads: list[MachineLoad | None]) -> MachineLoad | None:
        """Of a point's processes' loads, the one where others took the most (None: none measured)."""
        known = [x for x in loads if x is not None]
        return max(known, key=lambda x: x.others_cores / x.cores) if known else None


def no_gpu_here() -> bool:
    """True where CUDA can see no GPU for certain: a Linux host with no device node a GPU is reached
    through (NVIDIA's /dev/nvidia*, ROCm's /dev/kfd, WSL's /dev/dxg). Elsewhere only torch can say."""
    return sys.platform.startswith("linux") and not (glob.glob("/dev/nvidia*") or os.path.exists("/dev/kfd")
                                                     or os.path.exists("/dev/dxg"))


def _torch_build() -> tuple[str | None, str | None]:
    """The installed torch's version and the CUDA it was built for, read from its version.py
    without importing torch (seconds in every harness process); (None, None) without torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None, None
    source = importlib.util.spec_from_file_location("_installed_torch_version", Path(spec.origin).with_name("version.py"))
    module = importlib.util.module_from_spec(source)
    source.loader.exec_module(module)
    return str(module.__version__), module.cuda


@lru_cache(maxsize=1)
def detect() -> Machine:
    if no_gpu_here():
        return Machine(socket.gethostname(), platform.python_version(), *_torch_build(), os.cpu_count())
    import torch

    names, mem = (), ()
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        names, mem = tuple(p.name for p in props), tuple(round(p.total_memory / 2**30, 1) for p in props)
    return Machine(socket.gethostname(), platform.python_version(), torch.__version__, torch.version.cuda,
                   os.cpu_count(), names, mem)
