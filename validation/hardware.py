"""What this machine is (``Machine``), and whether it meets a hardware profile's minimums."""
from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from .runbook_types import Profile


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


@lru_cache(maxsize=1)
def detect() -> Machine:
    import torch

    names, mem = (), ()
    if torch.cuda.is_available():
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        names, mem = tuple(p.name for p in props), tuple(round(p.total_memory / 2**30, 1) for p in props)
    return Machine(socket.gethostname(), platform.python_version(), torch.__version__, torch.version.cuda,
                   os.cpu_count(), names, mem)


def shortfalls(profile: Profile, hw: Machine, min_gpus: int | None = None) -> list[str]:
    """Why this machine cannot run the profile at all (too few GPUs, too little memory)."""
    need = profile.hardware.min_gpus if min_gpus is None else max(min_gpus, profile.hardware.min_gpus)
    out = []
    if profile.hardware.accelerator == "cuda":
        if hw.gpu_count < max(need, 1):
            out.append(f"profile {profile.name} needs {max(need, 1)} CUDA GPU(s); this machine has {hw.gpu_count}")
        elif profile.hardware.min_gpu_mem_gb and min(hw.gpu_mem_gb) < profile.hardware.min_gpu_mem_gb:
            out.append(f"profile {profile.name} needs {profile.hardware.min_gpu_mem_gb} GiB per GPU; "
                       f"smallest here is {min(hw.gpu_mem_gb)} GiB")
    return out


def mismatches(profile: Profile, hw: Machine) -> list[str]:
    """Differences that do not stop a run (an H100 box may run the a100 acceptance) but are
    reported, or turned into skips by --hardware-mismatch=skip."""
    want = profile.hardware.gpu_name
    if want and hw.gpu_count and not all(want.lower() in n.lower() for n in hw.gpu_names):
        return [f"profile {profile.name} is for {want} GPUs; this machine has {', '.join(sorted(set(hw.gpu_names)))}"]
    if profile.hardware.accelerator == "cpu" and hw.gpu_count:
        return [f"profile {profile.name} is a CPU profile; this machine has {hw.gpu_count} GPU(s) (not used)"]
    return []
