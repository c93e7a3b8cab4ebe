"""On the GPU, NSA attention as a user's own model runs it: one NSA layer's forward + backward
runs at most MAX_LAUNCHES device kernels eagerly (plus memsets and copies, counted apart), is
enqueued by at most MAX_HOST_LAUNCHES launches from the host once its CUDA graphs are captured
(nsa.attention.graphed), and never waits for the device either way; and a model of a user's shape compiled with
mode="reduce-overhead" (CUDA graphs through the compiler) computes what the eager model does.
bench/nsa_vs_dense.py --parts launches --kernels 60 prints the count and its kernels by name."""
from __future__ import annotations

import pytest
import torch

from nsa.attention import NSAAttention
from nsa.model.config import load_model_config
from nsa.model.model import NSATransformer

pytestmark = pytest.mark.gpu

#: device kernels of one NSA layer forward + backward (m7c_125m's attention, bf16 autocast); the
#: count the per-call path is held to (bench/nsa_vs_dense.py --parts launches prints it)
MAX_LAUNCHES = 56
#: memsets and device-to-device copies of the same call
MAX_MEMSETS_AND_COPIES = 12
#: launches the host makes for that call (kernels, graphs, memsets, copies): two graph replays and
#: the copies around them (input, output, output gradient, input gradient, one per gradient dtype)
MAX_HOST_LAUNCHES = 8
#: the CUDA runtime and driver calls that enqueue work
_LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                 "cudaMemcpyAsync", "cudaMemsetAsync")


@pytest.fixture(autouse=True)
def _nan_poisoned_empty():
    """No NaN-filled torch.empty here (tests/kernels/conftest.py): its fills would be counted."""
    yield


def _layer_step(S: int, graphs: bool = True):
    cfg = load_model_config("m7c_125m")
    layer = NSAAttention(cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.attn, cfg.rope_theta,
                         graph_tokens=S if graphs else 0).cuda()
    x = torch.randn(1, S, cfg.dim, device="cuda", requires_grad=True)
    do = torch.randn(1, S, cfg.dim, device="cuda", dtype=torch.bfloat16)
    leaves = [x, *layer.parameters()]

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = layer(x)
        torch.autograd.grad(o, leaves, do)

    return run


@pytest.mark.parametrize("S", [4096, 16384])
def test_one_nsa_layer_enqueues_few_launches_without_syncs(S):
    from torch.profiler import ProfilerActivity, profile

    for graphs in (False, True):  # eagerly, and replayed
        run = _layer_step(S, graphs)
        run()  # Triton compiles and tunes
        run()  # with graphs: the capture, which synchronises once
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # a host synchronisation in the call raises
        try:
            run()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        if graphs:
            host = [e.name for e in prof.events()
                    if e.device_type == torch.autograd.DeviceType.CPU and e.name in _LAUNCH_CALLS]
            assert len(host) <= MAX_HOST_LAUNCHES, f"{len(host)} host launches: {sorted(host)}"
            continue
        device = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        other = [n for n in device if n.startswith(("Memset", "Memcpy"))]
        kernels = len(device) - len(other)
        assert kernels <= MAX_LAUNCHES, f"{kernels} kernels: {sorted(set(device))}"
        assert len(other) <= MAX_MEMSETS_AND_COPIES, other


@pytest.mark.parametrize("S", [32768, 65536])
def test_long_context_layer_never_waits_for_the_device(S):
    """The paths the counted lengths above do not take: from 32k the layer makes tensors again in
    its backward (compress.RECOMPUTE_TOKENS), from 64k the compressed branch runs on the cuDNN fold.
    A host synchronisation on either would cost the eager layer its overlap of host and GPU."""
    run = _layer_step(S, graphs=False)
    run()  # Triton compiles and tunes
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_reduce_overhead_model_equals_eager():
    """A user's shape (not the trainer's): 4 layers, 2 KV heads of head dim 64, S = 4096, bf16
    autocast; the compiled model's loss and gradients are the eager model's. A gradient that is zero
    in exact arithmetic is rounding noise in both runs, with no relative error to speak of: the
    compressed keys' output bias (compress_k.fc2.bias) shifts every key a query sees alike, which
    its softmax ignores (its float32 gradient is ~1e-10 of the largest). Such parameters, found by
    an eager float32 pass on the CPU (a float32 first call on the GPU compiles for minutes), are
    held to the whole gradient's relative error instead."""
    cfg = load_model_config("m7c_125m", ["model.n_layers=4"])
    torch.manual_seed(0)
    model = NSATransformer(cfg).cuda()
    torch.manual_seed(0)
    eager = NSATransformer(cfg).cuda()
    x = torch.randint(0, cfg.vocab_size, (1, 4096), device="cuda")
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)

    def loss_and_grads(fn, m):
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fn(x).float().logsumexp(-1).mean()
        loss.backward()
        return loss.detach().clone(), {n: p.grad.float().clone() for n, p in m.named_parameters()}

    torch.manual_seed(0)
    on_cpu = NSATransformer(cfg)
    on_cpu(x[:, :512].cpu()).logsumexp(-1).mean().backward()
    exact = {n: p.grad for n, p in on_cpu.named_parameters()}
    largest = max(g.norm() for g in exact.values())
    zero_by_symmetry = {n for n, g in exact.items() if g.norm() < 1e-8 * largest}
    assert zero_by_symmetry == {f"layers.{i}.attn.compress_k.fc2.bias" for i in range(cfg.n_layers)}
    ref_loss, ref_grads = loss_and_grads(eager, eager)
    for _ in range(3):  # warm-up, recording, replay
        loss, grads = loss_and_grads(compiled, model)
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=2e-2)
    whole = torch.cat([grads[n].flatten() - ref_grads[n].flatten() for n in grads]).norm()
    assert whole < 5e-2 * torch.cat([g.flatten() for g in ref_grads.values()]).norm()
    for name, g in grads.items():
        if name in zero_by_symmetry:
            continue
        ref = ref_grads[name]
        err = (g - ref).norm() / ref.norm().clamp_min(1e-12)
        assert err < 5e-2, f"{name}: relative error {err:.3g}"
