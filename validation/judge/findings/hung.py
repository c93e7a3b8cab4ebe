"""Which ranks of a stalled run hung, as against the ranks that waited for them: read from each
rank's stack (where it waited) and its last heartbeat (how far it got). The stall finding and the
hung-node finding both name them."""
from __future__ import annotations

from collections.abc import Mapping

from validation.contract.stacks import StackDump
from validation.judge.record import Beat

#: a frame of a collective: the rank waits there for the others
_COLLECTIVE = "torch/distributed/"
#: the autograd engine as a stack's innermost frame: DDP's reducer waits there, in C++ frames
#: py-spy does not show, for the gradient all-reduce of the ranks that have not come
_BACKWARD_ENGINE = "_engine_run_backward"


def in_collective(dump: StackDump) -> bool:
    """The rank was waiting for the others (a torch.distributed frame, or DDP's backward)."""
    if dump.frames and dump.frames[0].func == _BACKWARD_ENGINE:
        return True
    return any(_COLLECTIVE in fr.file.replace("\\", "/") for fr in dump.frames)


def hung_ranks(stacks: Mapping[int, StackDump], beats: Mapping[int, Beat]) -> list[int]:
    """The ranks outside the collectives while some rank waits in one; else the ranks furthest
    behind in their heartbeats, where the ranks got to different steps; else every rank outside
    a collective (all hung alike). Empty when nothing tells."""
    ranks = sorted(set(stacks) | set(beats))
    waiting = [k for k in ranks if k in stacks and in_collective(stacks[k])]
    outside = [k for k in ranks if k in stacks and stacks[k].frames and k not in waiting]
    if waiting and outside:
        return outside
    steps = {k: beats[k].step for k in ranks if k in beats and beats[k].step is not None}
    if len(set(steps.values())) > 1:
        return [k for k in steps if steps[k] == min(steps.values())]
    return outside
