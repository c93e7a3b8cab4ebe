"""Whether a machine meets a hardware profile's minimums, and how it differs from the profile's
GPUs (reported, or a skip under --hardware-mismatch=skip)."""
from __future__ import annotations

from validation.machine import Machine
from validation.runbook.types import Profile


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
