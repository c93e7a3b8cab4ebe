"""A rank waiting in DDP's own collective is waiting for the others (validation/judge/diagnosis/collectives.py
``in_collective``): DDP calls its buffers' broadcast before each forward from torch/nn/parallel, not
torch/distributed/, as a two-rank gloo run of a Hugging Face Trainer whose rank 1 hung at step 5 left
its stacks (py-spy, trimmed). The stall named both ranks alike, 'rank 0 stalled in
DistributedDataParallel._distributed_broadcast_coalesced; rank 1 stalled in Faults.on_step_begin'."""
from __future__ import annotations

from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.judge.diagnosis import Kind, diagnose
from validation.judge.diagnosis.collectives import in_collective
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

_SITE = "/v/lib/python3.11/site-packages"
_DDP_FORWARD = Frame(f"{_SITE}/torch/nn/parallel/distributed.py", 1886, "DistributedDataParallel.forward")
_TRAINER = [Frame(f"{_SITE}/transformers/trainer.py", 2209, "Trainer.compute_loss"),
            Frame("/u/train.py", 114, "main")]
#: rank 0: waiting in DDP's broadcast of its buffers, which rank 1 never joined
BROADCAST = StackDump("harness_stacks/rank0.txt", [
    Frame(f"{_SITE}/torch/nn/parallel/distributed.py", 2363, "DistributedDataParallel._distributed_broadcast_coalesced"),
    Frame(f"{_SITE}/torch/nn/parallel/distributed.py", 1782, "DistributedDataParallel._pre_forward"),
    _DDP_FORWARD, *_TRAINER], None, "py-spy")
#: rank 1: hung in a callback of its own, outside every collective
CALLBACK = StackDump("harness_stacks/rank1.txt", [
    Frame("/u/train.py", 68, "Faults.on_step_begin"),
    Frame(f"{_SITE}/transformers/trainer.py", 1939, "Trainer._run_epoch"), Frame("/u/train.py", 114, "main")],
    None, "py-spy")


def test_a_rank_in_ddps_own_collective_waits_for_the_rank_hung_outside_it():
    ev = Evidence(stackdumps={0: BROADCAST, 1: CALLBACK}, no_heartbeats="a Trainer writes no per-rank records",
                  taken_stacks=[TakenStack(11, 0, "RANK", "py-spy", "harness_stacks/rank0.txt"),
                                TakenStack(12, 1, "RANK", "py-spy", "harness_stacks/rank1.txt")])
    rec = PhaseRecord(PointKey("rb", "cpu", "hang"), "rb/cpu/hang/default", "train", Status.FAIL, "stalled",
                      steps=12, world_size=2, stalled_s=20.0, evidence=ev)
    d = diagnose(rec)
    assert d is not None and d.kind == Kind.HUNG and [at.rank for at in d.ranks] == [1]
    assert d.ranks[0].frame == "Faults.on_step_begin"


def test_ddps_forward_deeper_in_a_stack_is_no_wait_for_the_others():
    """DDP's forward calls the model: a rank hung inside its model's forward has DDP's frame under it
    and waits for no one."""
    in_model = StackDump("harness_stacks/rank1.txt", [Frame("/u/model.py", 40, "MyBlock.forward"),
                                                       _DDP_FORWARD, *_TRAINER], None, "py-spy")
    assert in_collective(BROADCAST) and not in_collective(in_model) and not in_collective(CALLBACK)
