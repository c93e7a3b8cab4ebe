"""Checkpoints: model, optimizer, data position, every rank's RNG and the resolved config, in one
file written by rank 0 (``checkpoints/step_{N:07d}.pt`` plus a ``latest`` pointer), loaded on
every rank with ``torch.load(weights_only=True)``.

Model and optimizer go through torch.distributed.checkpoint.state_dict, so the same file loads
into a single-GPU, DDP or FSDP2 model, with or without activation checkpointing or compile
wrappers (their prefixes are stripped from parameter names).
"""
from __future__ import annotations

import pickle
import random
import re
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nsa.atomic import write_atomic
from .distributed import DistInfo, barrier

FORMAT = 1
PAYLOAD_KEYS = ("step", "data_position", "world_size", "model", "optimizer", "rng", "config")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit this run; the message names the file."""


def ckpt_dir(out_dir: Path) -> Path:
    return Path(out_dir) / "checkpoints"


def set_aside(out_dir: Path) -> Path | None:
    """Move an earlier run's checkpoints folder to ``checkpoints.earlier-<k>`` beside it (the first
    k free), for a run starting afresh in the same out_dir; None where there is none."""
    folder = ckpt_dir(out_dir)
    if not folder.is_dir():
        return None
    k = 1
    while (aside := folder.with_name(f"{folder.name}.earlier-{k}")).exists():
        k += 1
    folder.rename(aside)
    return aside


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": _py_state_to_list(random.getstate())}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _py_state_to_list(s: tuple) -> list:
    return [s[0], list(s[1]), s[2]]


def save(out_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo,
         step: int, data_position: int, config: dict[str, Any]) -> Path:
    """Collective: every rank must call it. Returns the checkpoint path."""
    # imported where used: torch.distributed.checkpoint pulls in DTensor and sympy, seconds of a
    # trainer's start-up that a run which never saves would pay for nothing
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_sd = get_model_state_dict(model, options=opts)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=opts)
    rng = rng_state(info.device)
    if info.distributed:
        rngs: list[Any] = [None] * info.world_size
        dist.all_gather_object(rngs, rng)
    else:
        rngs = [rng]
    path = ckpt_dir(out_dir) / f"step_{step:07d}.pt"
    if info.is_master:
        payload = {
            "format": FORMAT, "step": step, "data_position": data_position, "world_size": info.world_size,
            "model": model_sd, "optimizer": optim_sd, "rng": rngs, "config": config,
        }
        pointer = path.parent / "latest"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # a process killed while writing (SIGTERM, SIGKILL: no cleanup) left a checkpoint-sized
            # temp file; every preemption mid-save would leave one more
            for stale in path.parent.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
            # through a Python file, so that a failed write raises its OSError (ENOSPC) rather
            # than torch's "basic_ios::clear: iostream error"
            write_atomic(path, lambda fh: torch.save(payload, fh))
            write_atomic(pointer, (path.name + "\n").encode())
        except (OSError, RuntimeError) as exc:
            kept = (f"the last checkpoint saved, {pointer.read_text().strip()}, is intact" if pointer.exists()
                    else "no checkpoint was saved before it")
            raise CheckpointError(f"cannot write checkpoint {path}: {_reason(exc)}; {kept}") from None
    barrier(info)
    return path


_STEP_FILE = re.compile(r"step_(\d{7,})\.pt")


def prune(out_dir: Path, keep: int, saved: Path, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Remove the checkpoints of out_dir older than the newest ``keep`` (train.keep_checkpoints; 0:
    none removed); returns the files removed. Rank 0 alone, after ``save`` wrote ``saved`` and the
    ``latest`` pointer. Never removes the checkpoint ``latest`` names, any in ``protect`` (the one
    a resume read), ``saved`` itself, or one of a step past ``saved``'s (an earlier run's, left
    beside a fresh run's). A file that cannot be removed is left, and not in the list."""
    if keep <= 0:
        return []
    folder = ckpt_dir(out_dir)
    match = _STEP_FILE.fullmatch(saved.name)
    if match is None:
        return []
    newest = int(match.group(1))
    pointer = folder / "latest"
    named = pointer.read_text().strip() if pointer.exists() else ""
    if named != saved.name:  # latest does not name what was just saved: nothing here is safe to judge
        return []
    spared = {saved.name, named} | {Path(p).name for p in protect if Path(p).parent.resolve() == folder.resolve()}
    older = sorted((int(m.group(1)), f) for f in folder.iterdir()
                   if (m := _STEP_FILE.fullmatch(f.name)) and int(m.group(1)) < newest)
    removed = []
    for _, f in older[:max(0, len(older) - (keep - 1))]:
        if f.name in spared:
            continue
        try:
            f.unlink()
        except OSError:
            continue
        removed.append(f)
    return removed


def _reason(exc: BaseException) -> str:
    """The OS's reason for a failed write ("No space left on device"): torch's writer raises its
    own "unexpected pos" RuntimeError while handling the OSError of the file's write."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return seen.strerror
        seen = seen.__cause__ or seen.__context__
    return str(exc).splitlines()[0]


def find_resume(out_dir: Path, resume: str) -> Path | None:
    """'' -> None; 'auto' -> the latest checkpoint in out_dir or None; the out_dir of an earlier
    run (a directory) -> its latest checkpoint, which must exist; else that checkpoint file."""
    if not resume:
        return None
    if resume == "auto":
        return _latest(out_dir)
    path = Path(resume)
    if path.is_dir():
        found = _latest(path)
        if found is None:
            raise CheckpointError(f"train.resume={resume!r}: the directory holds no checkpoint "
                                  f"({ckpt_dir(path) / 'latest'} not found)")
        return found
    if not path.exists():
        raise CheckpointError(f"train.resume={resume!r}: checkpoint file not found")
    return path


def _latest(out_dir: Path) -> Path | None:
    """The checkpoint ``checkpoints/latest`` of a run directory names, or None without one."""
    pointer = ckpt_dir(out_dir) / "latest"
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    if not name or Path(name).name != name:  # empty, or a path: it names a file beside it or nothing
        raise CheckpointError(f"{pointer}: expected the file name of a checkpoint beside it, got {name!r}")
    path = ckpt_dir(out_dir) / name
    if not path.exists():
        raise CheckpointError(f"{pointer} names {path.name}, which does not exist{_others(path)}")
    return path


def _others(path: Path) -> str:
    """For a checkpoint that is gone or damaged: the other checkpoints beside it, newest first, and
    how to resume the newest of them (train.keep_checkpoints keeps them for this), or ''."""
    folder = path.parent
    steps = sorted(((int(m.group(1)), f) for f in folder.glob("step_*.pt")
                    if (m := _STEP_FILE.fullmatch(f.name)) and f.name != path.name), reverse=True)
    if not steps:
        return ""
    return (f"; other checkpoints beside it: {', '.join(f.name for _, f in steps)}; to go back to one, "
            f"resume with train.resume={steps[0][1]}")


#: the train keys the LR schedule is computed from (nsa/train/optim.py lr_at)
SCHEDULE_KEYS = ("steps", "lr", "min_lr_ratio", "warmup_steps")


def schedule_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'train.steps: 100 in the checkpoint, 200 now' for each key of the LR schedule that differs
    between the checkpoint's train config and this run's."""
    return config_differences({k: saved.get(k) for k in SCHEDULE_KEYS}, {k: current[k] for k in SCHEDULE_KEYS},
                             "train")


def config_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "model") -> list[str]:
    """'model.dim: 64 in the checkpoint, 96 now' for each leaf of a config section (``prefix``)
    that differs between the checkpoint's and this run's."""
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, f"{prefix}.{key}")
        elif a != b:
            out.append(f"{prefix}.{key}: {a!r} in the checkpoint, {b!r} now")
    return out


#: the data keys that say which data a run reads (the others say how: timeouts, prefetch)
DATA_KEYS = ("dataset", "path", "text_column", "tokenizer", "pattern_period")


def data_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """'data.dataset: 'pattern' in the checkpoint, 'text' now' for each key of DATA_KEYS that
    differs between the checkpoint's data config and this run's."""
    return config_differences({k: saved.get(k) for k in DATA_KEYS}, {k: current.get(k) for k in DATA_KEYS}, "data")


def _check_data_position(path: Path, payload: dict[str, Any], batch: int, world: int, seq_len: int) -> None:
    """The data position counts global micro-batches of train.batch_size x world size rows of
    train.seq_len + 1 tokens (nsa/train/data.py): under another product or another row length it
    would re-read or skip data, silently."""
    train = payload["config"].get("train") if isinstance(payload["config"], dict) else None
    saved_batch, saved_world = (train or {}).get("batch_size"), payload["world_size"]
    saved_seq = (train or {}).get("seq_len")
    missing = [name for name, v in (("train.batch_size in its config", saved_batch),
                                    ("train.seq_len in its config", saved_seq), ("world_size", saved_world))
               if not isinstance(v, int)]
    if missing:
        raise CheckpointError(f"{path}: not a whole checkpoint of format {FORMAT}: no {', no '.join(missing)}, "
                              "which its data position is counted in")
    if saved_seq != seq_len:
        raise CheckpointError(
            f"{path}: its data position ({payload['data_position']} micro-batches) counts rows of "
            f"train.seq_len={saved_seq} (+1) tokens, this run's of {seq_len}: resumed, it would re-read or skip "
            f"data; resume with train.seq_len={saved_seq}")
    if saved_batch * saved_world == batch * world:
        return
    fits = (f"train.batch_size={saved_batch * saved_world // world}"
            if saved_batch * saved_world % world == 0 else f"a world size dividing {saved_batch * saved_world}")
    raise CheckpointError(
        f"{path}: its data position ({payload['data_position']} micro-batches) counts micro-batches of "
        f"{saved_batch * saved_world} rows (train.batch_size={saved_batch} x world size {saved_world}), this "
        f"run's have {batch * world} ({batch} x {world}): resumed, it would re-read or skip data; resume "
        f"with {fits} here")


#: how a file torch.load reads begins: torch.save's zip archive, or a pickle (protocol 2 and up) of
#: its legacy format (_use_new_zipfile_serialization=False)
_TORCH_MAGIC = (b"PK\x03\x04", b"\x80")


def _head(path: Path) -> bytes:
    """The first bytes of ``path``; b'' where it cannot be read (torch.load then says why)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(8)
    except OSError:
        return b""


def _read(path: Path) -> dict[str, Any]:
    """The checkpoint's payload, checked for its format and keys."""
    head = _head(path)
    if head and not head.startswith(_TORCH_MAGIC):  # a text file gave "KeyError: 105" from torch's legacy reader
        raise CheckpointError(f"{path}: cannot load checkpoint (not a torch checkpoint file: torch.save writes a zip "
                              f"archive, which begins with {_TORCH_MAGIC[0]!r}, and this file begins with {head!r})")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's advice, weights_only=False, would run what the file says
        raise CheckpointError(f"{path}: cannot load checkpoint (not a torch checkpoint, or one holding "
                              "objects that torch.load(weights_only=True) refuses)") from None
    except Exception as exc:  # whatever torch.load raises on a file cut short (an empty one: IndexError)
        raise CheckpointError(f"{path}: cannot load checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'the file is cut short'})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a checkpoint of format {FORMAT}")
    missing = [key for key in PAYLOAD_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"{path}: not a whole checkpoint of format {FORMAT}: no {', '.join(missing)}")
    return payload


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, info: DistInfo,
         config: dict[str, Any]) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG; returns {step, data_position, config}.
    ``config`` is this run's (config_dict), to name what differs when the model does not fit."""
    try:
        payload = _read(path)
    except CheckpointError as exc:  # a damaged file: name the ones to go back to
        raise CheckpointError(f"{exc}{_others(path)}") from None
    _check_data_position(path, payload, config["train"]["batch_size"], info.world_size, config["train"]["seq_len"])
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(model, payload["model"], options=opts)
    except RuntimeError as exc:
        saved = payload.get("config", {}).get("model")
        diffs = config_differences(saved, config["model"]) if isinstance(saved, dict) else []
        why = "; ".join(diffs) if diffs else str(exc).splitlines()[0]
        raise CheckpointError(f"{path}: model state does not fit this model ({why}); resume with the "
                              "config the checkpoint was written with, or use another out_dir") from None
    set_optimizer_state_dict(model, optimizer, payload["optimizer"], options=opts)
    rngs = payload["rng"]
    set_rng_state(rngs[info.rank % len(rngs)], info.device)
    return {"step": payload["step"], "data_position": payload["data_position"], "config": payload["config"]}
