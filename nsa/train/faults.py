"""Fault injection, for testing the trainer's safety paths. OFF unless ``fault.spec`` (env
``NSA_FAULT``) is set; when on it is recorded in env.json and announced on stderr.

Spec: one or more faults separated by commas, each ``KIND[:key=value]...``::

    NSA_FAULT="stall:rank=1:step=3"            rank 1 sleeps forever at step 3 -> watchdog path
    NSA_FAULT="crash:step=2:stage=backward"    every rank raises InjectedFault -> error exit
    NSA_FAULT="nan:rank=0:step=4"              rank 0's loss becomes NaN -> non-finite halt
    NSA_FAULT="oom:step=2"                     out of memory -> OOM report and exit
    NSA_FAULT="kill:rank=1:step=3"             rank 1 SIGKILLs itself -> dead-peer path
    NSA_FAULT="freeze:rank=1:step=3"           rank 1 SIGSTOPs itself, every thread of it (a node
                                               swapping or frozen) -> the peers' watchdog path
    NSA_FAULT="stall:rank=0:step=2:seconds=30" a finite stall (slow rank, no watchdog if short)
    NSA_FAULT="quit_early:step=4"              every rank stops after step 4, exit 0, no .HALT
    NSA_FAULT="malformed:step=3"               step 3's training.csv row holds a non-number
    NSA_FAULT="missing_optional"               env.json without its optional keys (git_sha,
                                               attention_backends, tokens_per_step)
    NSA_FAULT="spike:step=25:scale=10"         the loss of step 25 is multiplied by 10 (so are its
                                               gradients): a loss and grad-norm spike, no halt
    NSA_FAULT="resume_skip:batches=2"          a resumed run's data starts 2 micro-batches past
                                               the checkpoint's data position (data skipped)
    NSA_FAULT="resume_reseed"                  a resumed run reseeds its RNG with train.seed
                                               instead of restoring the checkpoint's RNG state

Keys: ``rank`` (default: every rank), ``step`` (1-based optimizer step, default 1), ``stage``
(data, forward, backward or optimizer; default forward, except nan and spike which always act on
the loss after forward), ``seconds`` (stall only; default: forever), ``scale`` (spike only;
default 10), ``batches`` (resume_skip only, required). quit_early takes ``step`` only;
resume_skip takes ``batches`` only; resume_reseed takes no key.

Each fault drives a real code path: stall really blocks the main thread (peers block in their
next collective, and the watchdog must notice); crash raises in the loop; nan poisons the
loss tensor, so backward and the non-finite guard see it; oom on CUDA really allocates more
than the device holds (on CPU it raises torch.OutOfMemoryError, as allocating would invite the
kernel's OOM killer instead); kill sends SIGKILL to its own process, as a dead node would; freeze
sends SIGSTOP to its own process, so its watchdog, heartbeat and faulthandler threads stop with it
and it leaves no stack dump of its own (only a harness that reads its stack from outside names it);
quit_early ends the loop after its step as if the run were done (the step logged, a checkpoint
saved, exit 0, no .HALT): a trainer that stops short and says nothing is a bug only the count of
steps completed against steps requested can catch, so a harness must be tried on it. malformed
and missing_optional break the artifact contract the way another trainer might (a row a reader
cannot parse; the recommended env.json keys left out), for the harness's fault matrix. spike
scales the loss tensor, so backward, the logged loss and the gradient norm all see it while the
run goes on (what a bad batch does). resume_skip and resume_reseed act only when a run resumes
from a checkpoint, and break it as a buggy trainer would: the data position and the RNG state
the checkpoint holds are not the ones the run continues from (env.json records the data position
the run really started at; the RNG is only drawn from where the model has dropout).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import torch

from ..config import ConfigError

KINDS = ("stall", "crash", "nan", "oom", "kill", "freeze", "quit_early", "spike", "resume_skip", "resume_reseed", "malformed",
         "missing_optional")
#: env.json keys the contract recommends but does not require (nsa/contract.py ENV_RECOMMENDED):
#: the missing_optional fault leaves these out
OPTIONAL_ENV_KEYS = ("git_sha", "attention_backends", "tokens_per_step")
STAGES = ("data", "forward", "backward", "optimizer")
#: faults that act at a stage boundary (FaultInjector.at); the others act on the loss or on resume
STAGE_KINDS = ("stall", "crash", "oom", "kill", "freeze")
#: the keys each fault kind takes (the general ones unless listed)
GENERAL_KEYS = ("rank", "step", "stage", "seconds")
KEYS = {"quit_early": ("step",), "spike": ("rank", "step", "scale"), "resume_skip": ("batches",), "resume_reseed": (),
        "malformed": ("step",), "missing_optional": ()}
_ALL_KEYS = {k for keys in (GENERAL_KEYS, *KEYS.values()) for k in keys}
DEFAULT_SPIKE_SCALE = 10.0


class InjectedFault(RuntimeError):
    """Raised by the 'crash' fault."""


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    step: int = 1
    stage: str = "forward"
    seconds: float | None = None
    scale: float = DEFAULT_SPIKE_SCALE
    batches: int = 0

    def applies(self, rank: int, step: int, stage: str) -> bool:
        return (self.rank is None or self.rank == rank) and self.step == step and self.stage == stage


def parse_faults(spec: str) -> list[Fault]:
    """Parse a fault spec; errors name fault.spec / NSA_FAULT and the bad part."""
    faults = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, *params = item.split(":")
        if kind not in KINDS:
            raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: unknown fault {kind!r}; kinds: {', '.join(KINDS)}")
        kw: dict = {"kind": kind, "stage": "forward"}
        takes = KEYS.get(kind, GENERAL_KEYS)
        for p in params:
            key, eq, value = p.partition("=")
            if not eq:
                raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: expected key=value, got {p!r}")
            if key not in _ALL_KEYS:
                raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: unknown key {key!r}; keys: "
                                  f"{', '.join(sorted(_ALL_KEYS))}")
            if key not in takes:
                raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: {kind} takes "
                                  + (", ".join(takes) + " only" if takes else "no key")
                                  + (" (every rank quits)" if kind == "quit_early" else ""))
            if key == "stage":
                if value not in STAGES:
                    raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: stage must be one of {STAGES}")
                kw[key] = value
                continue
            try:
                kw[key] = float(value) if key in ("seconds", "scale") else int(value)
            except ValueError:
                raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: {key}={value!r} is not a number") from None
        if kind == "resume_skip" and kw.get("batches", 0) < 1:
            raise ConfigError(f"fault.spec (NSA_FAULT) {item!r}: resume_skip needs batches=K with K >= 1")
        if kind in ("nan", "spike"):
            kw["stage"] = "forward"
        faults.append(Fault(**kw))
    return faults


class FaultInjector:
    def __init__(self, spec: str, rank: int, device: torch.device, log):
        self.faults = parse_faults(spec) if spec else []
        self.rank, self.device = rank, device
        if self.faults:
            log(f"[fault] FAULT INJECTION ACTIVE: {spec}")

    def __bool__(self) -> bool:
        return bool(self.faults)

    def quit_after(self) -> int | None:
        """The step after which quit_early ends the run, if one is set."""
        steps = [f.step for f in self.faults if f.kind == "quit_early"]
        return min(steps) if steps else None

    def garbled_row(self, step: int) -> bool:
        """Whether step's training.csv row is to hold a non-number (malformed)."""
        return any(f.kind == "malformed" and f.step == step for f in self.faults)

    def drop_optional(self, env: dict) -> dict:
        """env.json as written: without its optional keys under missing_optional."""
        if not any(f.kind == "missing_optional" for f in self.faults):
            return env
        return {k: v for k, v in env.items() if k not in OPTIONAL_ENV_KEYS}

    def resume_skip(self) -> int:
        """Micro-batches a resumed run's data skips past the checkpoint's position (resume_skip)."""
        return sum(f.batches for f in self.faults if f.kind == "resume_skip")

    @property
    def resume_reseed(self) -> bool:
        """Whether a resumed run reseeds its RNG instead of restoring the checkpoint's."""
        return any(f.kind == "resume_reseed" for f in self.faults)

    def at(self, step: int, stage: str) -> None:
        """Called at every stage boundary; triggers the matching stage faults."""
        for f in self.faults:
            if f.kind not in STAGE_KINDS or not f.applies(self.rank, step, stage):
                continue
            if f.kind == "stall":
                end = None if f.seconds is None else time.monotonic() + f.seconds
                while end is None or time.monotonic() < end:
                    time.sleep(0.05)  # really blocked: no beats, no collectives
            elif f.kind == "crash":
                raise InjectedFault(f"injected crash on rank {self.rank} at step {step} stage {stage}")
            elif f.kind == "oom":
                self._oom(step)
            elif f.kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif f.kind == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)

    def corrupt_loss(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        for f in self.faults:
            if f.kind == "nan" and f.applies(self.rank, step, "forward"):
                loss = loss * float("nan")
            elif f.kind == "spike" and f.applies(self.rank, step, "forward"):
                loss = loss * f.scale
        return loss

    def _oom(self, step: int) -> None:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            torch.empty(int(total) * 2, dtype=torch.uint8, device=self.device)  # raises OutOfMemoryError
        raise torch.OutOfMemoryError(f"injected out-of-memory on rank {self.rank} at step {step} (CPU run)")
