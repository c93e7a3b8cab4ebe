"""CUDA graphs around the training step: the forward and backward of every micro-batch of an
optimizer step, captured once and replayed at every step after.

Why: at the seeds' production shape (m7c_125m, 2 rows x 2 micro-batches of 2048 tokens) an
eager step launches thousands of small kernels, and the host launching them, not the GPU
running them, sets the pace. A replay launches them all with one call.

What stays outside the graph: loading the data (copied into the graph's static input buffers
before each replay), the gradient clip, the step's one host sync (loss, grad norm and the
operator-halt flag gathered from every rank), the non-finite guard and the optimizer step, which
must come after that guard.

How the captured state stays valid across replays:
* the parameters' gradients are None when capture starts, so the captured backward creates them
  in the graph's memory pool (under DDP: its bucket views); every replay overwrites them, so the
  trainer must never zero or free them after capture (``StepGraph.owns_grads``);
* one side stream carries everything from model construction on: the eager warm-up steps, the
  capture and the replays (PyTorch needs DDP built on the stream its all-reduces are captured on);
* the first steps run eagerly: compilation, Triton's first launches, lazy CUDA handles, the
  optimizer's state and DDP's bucket rebuild happen before capture. DDP needs at least 11 eager
  iterations before its backward can be captured (PyTorch's CUDA graphs notes).

``plan`` decides from the config whether a run uses graphs and records why not; the trainer and
bench/train_throughput.py both run their steps through ``StepGraph``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..config import ConfigError

#: eager steps before capture: the first step compiles and launches every kernel once, the
#: second runs with the optimizer state and allocator settled
WARMUP_STEPS = 2
#: DDP: "your warmup must run at least 11 DDP-enabled eager iterations before capture"
#: (PyTorch CUDA semantics, "Usage with DistributedDataParallel")
DDP_WARMUP_STEPS = 11

FSDP_REASON = ("FSDP2 all-gathers each block's parameters into memory it allocates before, and "
               "frees after, every forward and backward, from hooks that run on the host; a graph "
               "replays fixed addresses and no host code, so FSDP2 steps run eagerly")


@dataclass(frozen=True)
class GraphPlan:
    """Whether this run's steps are CUDA graphs, and why (recorded in env.json)."""

    setting: str
    enabled: bool
    reason: str
    warmup_steps: int = 0
    """Eager steps of this process before the step that is captured."""


def plan(setting: str, device_type: str, dist_mode: str, fault_spec: str) -> GraphPlan:
    """The run's graph plan. ``auto`` falls back to eager steps with the reason; ``on`` with a
    reason against it is a ConfigError naming the key."""
    if setting == "off":
        return GraphPlan(setting, False, "off by config (train.cuda_graphs=off)")
    blockers = []
    if device_type != "cuda":
        blockers.append(f"CUDA graphs need a CUDA device and this run is on {device_type}")
    if dist_mode == "fsdp":
        blockers.append(FSDP_REASON)
    if fault_spec:
        blockers.append("fault injection (fault.spec) fires between a step's stages, which a replay does not have")
    if blockers:
        if setting == "on":
            raise ConfigError(f"train.cuda_graphs=on cannot be honoured: {'; '.join(blockers)}. "
                              "Use train.cuda_graphs=auto (eager where graphs cannot run) or off")
        return GraphPlan(setting, False, f"{setting}: eager steps: {'; '.join(blockers)}")
    warmup = DDP_WARMUP_STEPS if dist_mode == "ddp" else WARMUP_STEPS
    return GraphPlan(setting, True, f"{setting}: every micro-batch's forward and backward replayed as one "
                                    f"CUDA graph after {warmup} eager warm-up steps", warmup)


Batch = tuple[torch.Tensor, torch.Tensor]


class StepGraph:
    """The forward and backward of one optimizer step's micro-batches as one CUDA graph.

    ``run(batches, body)`` captures ``body(static_batches)`` on its first call and replays it on
    every call (after copying ``batches`` into the static buffers); it returns what ``body``
    returned at capture, whose memory every replay refreshes. Call it with the stream given
    here as the current stream, the one the warm-up steps ran on."""

    def __init__(self, stream: torch.cuda.Stream):
        self.stream = stream
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: list[Batch] = []
        self.outputs = None

    @property
    def owns_grads(self) -> bool:
        """After capture the gradients live in the graph: never set them to None."""
        return self.graph is not None

    def release(self) -> None:
        """Free the graph once the device is done with it. Before the process group goes: a
        graph holding NCCL kernels keeps its communicator busy, and destroying the group with
        the graph alive hangs at exit (DDP over NCCL)."""
        if self.graph is not None:
            torch.cuda.synchronize()
            self.graph.reset()
            self.graph, self.inputs, self.outputs = None, [], None

    def run(self, batches: Sequence[Batch], body: Callable[[list[Batch]], object]):
        if self.graph is None:
            self.inputs = [(x.clone(), y.clone()) for x, y in batches]
            graph = torch.cuda.CUDAGraph()
            # thread_local: the loader and watchdog threads may touch CUDA state during capture
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                self.outputs = body(self.inputs)
            self.graph = graph  # capture records the work without running it: replay runs it
        else:
            if len(batches) != len(self.inputs):
                raise ValueError(f"captured with {len(self.inputs)} micro-batches, called with {len(batches)}")
            for (sx, sy), (x, y) in zip(self.inputs, batches):
                sx.copy_(x, non_blocking=True)
                sy.copy_(y, non_blocking=True)
        self.graph.replay()
        return self.outputs
