"""Process-group setup and teardown. Distributed is detected only from torchrun's environment
(RANK, WORLD_SIZE, LOCAL_RANK); gloo on CPU, nccl on CUDA; torch.cuda.set_device(local_rank)
always on CUDA, before anything touches the GPU."""
from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from ..config import ConfigError
from .config import DistConfig, TrainConfig


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    mode: str
    """single, ddp or fsdp (never auto)."""
    backend: str | None
    """gloo or nccl; None for a single process without a process group."""
    device: torch.device

    @property
    def is_master(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def peers(self) -> list[int]:
        """The other ranks of the run."""
        return [r for r in range(self.world_size) if r != self.rank]


def torchrun_env(env: Mapping[str, str] | None = None) -> tuple[int, int, int] | None:
    """(rank, local_rank, world_size) when launched by torchrun, else None."""
    env = os.environ if env is None else env
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise ConfigError(
            f"RANK={env.get('RANK')!r} WORLD_SIZE={env.get('WORLD_SIZE')!r} "
            f"LOCAL_RANK={env.get('LOCAL_RANK')!r}: not integers (set by torchrun)"
        ) from None
    return rank, local, world


def launch_time(env: Mapping[str, str] | None = None) -> float:
    """When this run was launched (seconds since the epoch): this process's start, or under
    torchrun (TORCHELASTIC_RUN_ID) its agent's, which started it."""
    import psutil

    env = os.environ if env is None else env
    me = psutil.Process()
    started = me.create_time()
    if "TORCHELASTIC_RUN_ID" in env:
        parent = me.parent()
        if parent is not None:
            started = min(started, parent.create_time())
    return started


def resolve_mode(mode: str, world_size: int) -> str:
    if mode == "auto":
        return "ddp" if world_size > 1 else "single"
    if mode == "single" and world_size > 1:
        raise ConfigError(
            f"dist.mode=single under torchrun with WORLD_SIZE={world_size}: every rank would train "
            "alone and overwrite the same outputs; use dist.mode=ddp or fsdp, or --nproc_per_node=1"
        )
    return mode


def pick_device(train: TrainConfig, local_rank: int) -> torch.device:
    want = train.device
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if want == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("train.device=cuda but torch.cuda.is_available() is False; expected auto or cpu "
                              "on a machine without a usable CUDA GPU")
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA devices are visible"
            )
        torch.cuda.set_device(local_rank)  # before any CUDA allocation or NCCL init
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(dcfg: DistConfig, train: TrainConfig) -> DistInfo:
    launched = torchrun_env()
    rank, local_rank, world = launched or (0, 0, 1)
    mode = resolve_mode(dcfg.mode, world)
    device = pick_device(train, local_rank)
    backend = None
    if launched is not None:
        backend = dcfg.backend if dcfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    elif mode in ("ddp", "fsdp"):
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ConfigError("dist.backend=nccl needs CUDA; use gloo (or auto) on CPU")
    if mode == "ddp" and dcfg.ddp_compress != "none" and backend != "nccl":  # before the model is built
        raise ConfigError(
            f"dist.ddp_compress={dcfg.ddp_compress} needs the NCCL backend (CUDA); the {backend} backend cannot "
            "all-reduce compressed buckets. Set dist.ddp_compress=none (or unset NSA_DDP_COMPRESS)"
        )
    if launched is not None:
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=dcfg.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    elif mode in ("ddp", "fsdp"):
        # one process: DDP/FSDP over a world of 1 still exercises the wrappers
        dist.init_process_group(
            backend=backend,
            init_method="tcp://127.0.0.1:0",
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=dcfg.timeout_s),
        )
    return DistInfo(rank, local_rank, world, mode, backend, device)


def barrier(info: DistInfo) -> None:
    if info.distributed:
        if info.backend == "nccl":
            dist.barrier(device_ids=[info.local_rank])
        else:
            dist.barrier()


def all_gather_stats(info: DistInfo, values: torch.Tensor) -> list[list[float]]:
    """Every rank's copy of a short 1-D float tensor. One collective and one host sync point
    (the .tolist()) per call: the trainer calls it once per step."""
    t = values.detach().to(torch.float64)
    if not info.distributed:
        return [t.tolist()]
    out = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(out, t)
    return torch.stack(out).tolist()


#: what gloo and NCCL say when a peer of this rank's collective is gone: its process ended (killed,
#: crashed, exited) or its host went away. gloo: "Read error [127.0.0.1]:6051: Connection reset by
#: peer", "Connection closed by peer", a write's "Broken pipe"; NCCL: "remote process exited or there
#: was a network error"
_PEER_GONE = re.compile(r"Connection (closed|reset) by peer|Broken pipe|remote process exited", re.IGNORECASE)


def lost_peer(info: DistInfo, exc: BaseException, gone: Callable[[], Sequence[int]] = tuple) -> str | None:
    """The peer an error of this rank's collective says is gone: 'rank 1' where it can be known (a
    world of two: the other rank; else the ranks ``gone()`` returns, those whose processes are seen
    to have ended, looked up only for such an error), else 'a peer rank (...)'; None for any other
    error. The backend's own text names an address and a source line, not a rank."""
    if not info.distributed or info.world_size < 2 or not _PEER_GONE.search(str(exc)):
        return None
    if len(info.peers) == 1:
        return f"rank {info.peers[0]}"
    if gone := gone():
        return (f"rank {gone[0]}" if len(gone) == 1 else f"ranks {', '.join(map(str, gone))}") + " (process gone)"
    return "a peer rank (the backend's error does not say which)"


def teardown(info: DistInfo, synchronize: bool = False, timeout_s: float = 60.0, abandon: bool = False) -> None:
    """Destroy the process group. With synchronize (a clean finish on every rank), first wait for
    all ranks: a gloo rank that destroys its group while its peer still has traffic in flight can
    abort at exit ("terminate called without an active exception"). The wait
    is bounded on gloo (monitored_barrier); after an error it is skipped, as a peer may be gone.
    abandon (an unexpected error on this rank, whose process then ends with os._exit): the group
    is left alone, as destroying it is collective on NCCL and waits for peers that may be blocked
    in a collective for this very rank."""
    if abandon or not (info.distributed and dist.is_initialized()):
        return
    if synchronize:
        try:
            if info.backend == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True)
            else:
                barrier(info)
        except RuntimeError as exc:  # a peer that never arrives must not keep this rank alive
            print(f"[rank {info.rank}] teardown: ranks did not meet before exit: {exc}", flush=True)
    dist.destroy_process_group()
