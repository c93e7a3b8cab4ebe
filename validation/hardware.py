"""What this machine is, and whether it meets a hardware profile's minimums."""
from __future__ import annotations

import os
import platform
import socket
from functools import lru_cache
from typing import Any

from .runbook_types import Profile


@lru_cache(maxsize=1)
def detect() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "gpu_count": 0,
        "gpu_names": [],
        "gpu_mem_gb": [],
    }
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(n)]
        info.update(gpu_count=n, gpu_names=[p.name for p in props],
                    gpu_mem_gb=[round(p.total_memory / 2**30, 1) for p in props])
    info["accelerator"] = "cuda" if info["gpu_count"] else "cpu"
    return info


def describe(hw: dict[str, Any]) -> str:
    if hw.get("gpu_count"):
        names = sorted(set(hw["gpu_names"]))
        return f"{hw['gpu_count']}x {', '.join(names)} ({min(hw['gpu_mem_gb'])} GiB)"
    return f"CPU only ({hw.get('cpu_count')} cores)"


def shortfalls(profile: Profile, hw: dict[str, Any], min_gpus: int | None = None) -> list[str]:
    """Why this machine cannot run the profile at all (too few GPUs, too little memory)."""
    need = profile.hardware.min_gpus if min_gpus is None else max(min_gpus, profile.hardware.min_gpus)
    out = []
    if profile.hardware.accelerator == "cuda":
        if hw["gpu_count"] < max(need, 1):
            out.append(f"profile {profile.name} needs {max(need, 1)} CUDA GPU(s); this machine has {hw['gpu_count']}")
        elif profile.hardware.min_gpu_mem_gb and min(hw["gpu_mem_gb"]) < profile.hardware.min_gpu_mem_gb:
            out.append(f"profile {profile.name} needs {profile.hardware.min_gpu_mem_gb} GiB per GPU; "
                       f"smallest here is {min(hw['gpu_mem_gb'])} GiB")
    return out


def mismatches(profile: Profile, hw: dict[str, Any]) -> list[str]:
    """Differences that do not stop a run (an H100 box may run the a100 acceptance) but are
    reported, or turned into skips by --hardware-mismatch=skip."""
    want = profile.hardware.gpu_name
    if want and hw["gpu_count"] and not all(want.lower() in n.lower() for n in hw["gpu_names"]):
        return [f"profile {profile.name} is for {want} GPUs; this machine has {', '.join(sorted(set(hw['gpu_names'])))}"]
    if profile.hardware.accelerator == "cpu" and hw["gpu_count"]:
        return [f"profile {profile.name} is a CPU profile; this machine has {hw['gpu_count']} GPU(s) (not used)"]
    return []
