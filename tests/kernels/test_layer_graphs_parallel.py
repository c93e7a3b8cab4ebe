"""On the GPU: a user's model with NSA layers that replay their own CUDA graphs
(nsa.attention.graphed), wrapped in DDP or FSDP2 as a user wraps it, trains as the same model with
the graphs off: the same losses and gradients step after step. One rank (NCCL, world size 1): the
wrappers' hooks, buckets and, under FSDP2, parameters gathered for the forward, freed after it
and gathered again for the backward, which the backward graph cannot follow. Both models run
with deterministic algorithms, so that they can differ only where the graphs compute something
else: with the kernels' atomic sums, a gradient that sums to about zero (the compressed keys'
bias: each query's attention gradients over its keys sum to zero) differs between two eager runs
by far more than a tolerance relative to it."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from nsa.attention import graphed
from nsa.model.config import load_model_config
from nsa.model.model import NSATransformer

pytestmark = pytest.mark.gpu

S = 2048
STEPS = 4


@pytest.fixture(autouse=True)
def _nan_poisoned_empty():
    """Plain torch.empty (tests/kernels/conftest.py would fill it with NaN on every call)."""
    yield


@pytest.fixture
def deterministic(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # what deterministic cuBLAS asks for
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])


@pytest.fixture
def one_rank():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        yield
    finally:
        dist.destroy_process_group()


def _wrap(model, how: str):
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[0])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mp_policy=mp, reshard_after_forward=True)
    return fully_shard(model, mp_policy=mp, reshard_after_forward=True)


def _train(model, how: str) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    wrapped = _wrap(model, how)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(0)
    losses, grads = [], []
    for _ in range(STEPS):
        tokens = torch.randint(0, 256, (1, S + 1), device="cuda", generator=g)
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=how == "ddp"):
            logits = wrapped(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, 256), tokens[:, 1:].reshape(-1))
        loss.backward()
        losses.append(loss.item())
        grads.append({n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).float().clone()
                      for n, p in wrapped.named_parameters()})
        opt.step()
    return losses, grads


@pytest.mark.parametrize("how", ["ddp", "fsdp2"])
def test_a_wrapped_model_trains_as_it_does_without_the_graphs(one_rank, deterministic, how):
    cfg = load_model_config("m7c_125m", ["model.n_layers=2"])
    torch.manual_seed(0)
    with_graphs = NSATransformer(cfg).cuda()
    without = copy.deepcopy(with_graphs)
    graphed.set_graph_tokens(with_graphs, S)
    graphed.set_graph_tokens(without, 0)
    got_losses, got_grads = _train(with_graphs, how)
    want_losses, want_grads = _train(without, how)
    for step, (got, want) in enumerate(zip(got_grads, want_grads)):
        assert abs(got_losses[step] - want_losses[step]) <= 2e-3 * abs(want_losses[step]), (step, got_losses, want_losses)
        for name, g in got.items():
            err = (g - want[name]).norm() / want[name].norm().clamp_min(1e-12)
            assert err < 2e-2, f"step {step} {name}: relative error {err:.3g}"
    layers = [m for m in with_graphs.modules() if isinstance(getattr(m, "graphs", None), graphed.LayerGraphs)]
    replayed = [entry.generation for m in layers for entry in m.graphs.captured.values()]
    print(f"{how}: replays per kept capture {replayed}; layers graphed off: "
          f"{sum(m.graphs.disabled for m in layers)} of {len(layers)}")
    if how == "ddp":  # the parameters stay put: every layer replays from its second step on
        assert len(replayed) == len(layers) and min(replayed) == STEPS - 1, replayed
