"""Where the ranks of a run wait, from their stacks and heartbeats: in a collective or outside them
(``in_collective``), the ranks the others waited for (``hung_ranks``, ``waited_for``), and the call
site of each rank's collective, which tells apart ranks whose collectives went apart (``apart``)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from validation.contract.stacks import COLLECTIVE, NOT_COLLECTIVE, TORCH_PACKAGE, Frame, StackDump
from validation.contract.torchrun_log import RankFailure
from validation.judge.diagnosis.beats import behind
from validation.judge.record import Beat

#: torch's frames that only pass a call on, which may lie above a collective's own frame (the
#: dispatcher's op call of a functional collective's wait, a decorator's or a compiler guard's
#: wrapper): the innermost frame of the rank's own is the first below them
_PASSING = ("torch/_ops.py", "torch/utils/_contextlib.py", "torch/_compile.py", "torch/_dynamo/eval_frame.py",
            "torch/_tensor.py", "torch/overrides.py", "torch/utils/_python_dispatch.py", "torch/autograd/function.py")
#: DDP's module, where it calls the C++ collectives itself (its buffers' broadcast before each
#: forward, its parameters' first sync): as the innermost frame, the rank waits there for the others.
#: Deeper in a stack it is only DDP's forward calling the model, where a rank hangs of its own.
_DDP = "torch/nn/parallel/distributed.py"
#: the autograd engine as a stack's innermost frame: DDP's reducer waits there, in C++ frames
#: py-spy does not show, for the gradient all-reduce of the ranks that have not come
_BACKWARD_ENGINE = "_engine_run_backward"


def in_collective(dump: StackDump) -> bool:
    """The rank was waiting for the others: where it was blocked, its innermost frames (the top of
    the stack, torch's frames that pass a call on aside) are a torch.distributed collective's, DDP's
    own collective, or DDP's backward. A torch.distributed frame deeper in the stack says nothing:
    ``@record`` puts one at the bottom of every rank's stack, and FSDP's forward lies under the
    model's code, where a rank hangs of its own. Nor does torch's own code run as a module of torch's is
    imported (``Import.torch_code``): a rank importing torch.distributed at start-up waits for no peer."""
    if dump.importing is not None and dump.importing.torch_code:
        return False
    files = [fr.file.replace("\\", "/") for fr in dump.frames]
    if dump.frames and (dump.frames[0].func == _BACKWARD_ENGINE or files[0].endswith(_DDP)):
        return True
    own = next((f for f in files if not any(p in f for p in _PASSING)), None)
    return own is not None and COLLECTIVE in own and not any(n in own for n in NOT_COLLECTIVE)


def hung_ranks(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat]) -> list[int]:
    """The ranks outside the collectives while some rank waits in one; else, of the ranks outside
    them and those of no stack that are furthest behind of all (else of every rank with a heartbeat),
    those furthest behind (``behind``). Empty when every rank waits in a collective and none is behind
    the others: nothing tells. A rank of no stack (frozen by SIGSTOP, or py-spy failed on it) may be
    anywhere, so where its heartbeat is the furthest behind it is a candidate: over NCCL the rank that
    waits for it shows no collective frame (its wait is a CUDA synchronisation inside the training
    step), and only the heartbeats tell them apart."""
    ranks = sorted(set(stacks) | set(beats))
    waiting = [k for k in ranks if k in stacks and in_collective(stacks[k])]
    outside = [k for k in ranks if k in stacks and stacks[k].frames and k not in waiting]
    if waiting and outside:
        return outside
    known = [k for k in ranks if k in beats and beats[k].step is not None]
    last = behind(known, beats)
    unstacked = [k for k in last if not (k in stacks and stacks[k].frames)]  # of no stack, and furthest behind
    candidates = sorted(outside + unstacked)
    hung = behind(candidates, beats) if candidates else last
    return [] if not outside and len(hung) == len(known) else hung


def call_site(dump: StackDump) -> Frame | None:
    """The frame of the code that called the collective ``dump`` waits in: the innermost frame outside
    torch's own package (the trainer's, or a library's such as transformers' Trainer); None where every
    frame is torch's. Two ranks waiting in the same collective at different call sites wait for
    different collectives: the call site, not the collective's name, says where a rank is."""
    return next((fr for fr in dump.frames if TORCH_PACKAGE not in fr.file.replace("\\", "/")), None)


@dataclass(frozen=True)
class Place:
    """Where a rank waits in a collective: the last step its heartbeats say it completed and the call
    site of its collective (``call_site``); ranks at one place wait for the same collective."""

    done: int | None
    """Beat.done; None where the ranks' heartbeats cannot say it (``places``)."""
    site: Frame | None


def places(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat], ranks: list[int]) -> dict[int, Place]:
    """Where each of ``ranks`` waits. A step tells only where every rank's records come every step: a
    rank that beats every few steps may have run on past its last record with the others."""
    by_step = all((b := beats.get(k)) is not None and (b.every or 1) == 1 for k in ranks)
    return {k: Place(beats[k].done if by_step else None, call_site(stacks[k])) for k in ranks}


@dataclass(frozen=True)
class Split:
    """Ranks in collectives, not all at one place (``apart``, ``majority``)."""

    off: tuple[int, ...]
    """The ranks away from the place a strict majority waits at; () where no majority waits at one
    place, and nothing tells which rank left the common path."""
    common: tuple[int, ...]
    """That majority; () where there is none."""


def apart(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat], world: int) -> Split | None:
    """Of a world whose every rank waits in a collective (``in_collective``), not all at one place
    (``places``): the ranks off the common path and those of it. None where a rank has no stack or
    waits outside the collectives (a hang of its own: ``hung_ranks``), every rank waits at one place
    (nothing tells), or no majority waits at one place and the ranks' steps differ (the one behind is
    the one the others wait for: ``hung_ranks``)."""
    ranks = list(range(world))
    if world < 2 or not all(k in stacks and stacks[k].frames and in_collective(stacks[k]) for k in ranks):
        return None
    at = places(stacks, beats, ranks)
    if len(set(at.values())) == 1:
        return None
    split = majority(at, world)
    return split if split.off or len({p.done for p in at.values()}) == 1 else None


def majority(at: Mapping[int, Hashable], world: int) -> Split:
    """Of ranks at places (``at``, of the ranks where each is known), not all at one: those away from the
    place a strict majority of the ``world`` is at, and that majority; Split((), ()) where none is."""
    counts = Counter(at.values())
    common, n = counts.most_common(1)[0]
    if 2 * n <= world:
        return Split((), ())
    return Split(tuple(k for k in sorted(at) if at[k] != common), tuple(k for k in sorted(at) if at[k] == common))


def waited_for(failures: Mapping[int, RankFailure], beats: Mapping[int, Beat]) -> list[int]:
    """Of a run some of whose ranks' collective gave up waiting for a peer (RankFailure.gave_up_waiting:
    gloo's timeout raised in them, or their NCCL watchdog took them down): the ranks they waited for.
    Those torchrun's agent ended once the first of them was down (RankFailure.by_agent), with no
    exception and no watchdog of their own, were still running and not in that collective; of them,
    those furthest behind (``behind``): one left is the one. [] where no collective gave up so, no
    rank was left running, or several were and no heartbeat tells them apart (nothing tells)."""
    if not any(f.gave_up_waiting for f in failures.values()):
        return []
    running = sorted(k for k, f in failures.items() if f.by_agent and not f.exception and f.nccl_watchdog is None)
    hung = behind(running, beats)
    return [] if len(running) > 1 and len(hung) == len(running) else hung
