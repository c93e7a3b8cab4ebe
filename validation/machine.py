"""What this machine is: ``Machine`` (stored in every record) and ``detect()``."""
from __future__ import annotations

import glob
import importlib.util
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
