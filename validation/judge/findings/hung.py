"""Which ranks of a stalled run hung, as against the ranks that waited for them: read from each
rank's stack (where it waited) and its last heartbeat (how far it got). The stall finding and the
hung-node finding both name them."""
from __future__ import annotations

from collections.abc import Mapping

from validation.contract.stacks import StackDump
from validation.contract.torchrun_log import RankFailure
from validation.judge.record import Beat

#: a frame of a collective: the rank waits there for the others
_COLLECTIVE = "torch/distributed/"
#: the autograd engine as a stack's innermost frame: DDP's reducer waits there, in C++ frames
#: py-spy does not show, for the gradient all-reduce of the ranks that have not come
_BACKWARD_ENGINE = "_engine_run_backward"
#: the stages of one step in the order a rank enters them (nsa/contract.py's heartbeat ``stage``)
STAGE_ORDER = ("data", "forward", "backward", "optimizer", "step")


def in_collective(dump: StackDump) -> bool:
    """The rank was waiting for the others (a torch.distributed frame, or DDP's backward)."""
    if dump.frames and dump.frames[0].func == _BACKWARD_ENGINE:
        return True
    return any(_COLLECTIVE in fr.file.replace("\\", "/") for fr in dump.frames)


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


def behind(ranks: list[int], beats: Mapping[int, Beat]) -> list[int]:
    """Those of ``ranks`` furthest behind by their last heartbeat: the lowest step, then the
    earliest stage of it (where every stage is one whose order is known); all of them when one
    has no heartbeat. Where no stack tells (every rank outside the collectives in frames py-spy
    shows, or none recorded), the hung rank is the one that never got as far in the step."""
    if not ranks or any(k not in beats or beats[k].step is None for k in ranks):
        return ranks
    low = min(beats[k].step for k in ranks)
    ranks = [k for k in ranks if beats[k].step == low]
    if any(beats[k].stage not in STAGE_ORDER for k in ranks):
        return ranks
    first = min(STAGE_ORDER.index(beats[k].stage) for k in ranks)
    return [k for k in ranks if STAGE_ORDER.index(beats[k].stage) == first]


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
