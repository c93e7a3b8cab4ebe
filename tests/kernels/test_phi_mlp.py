"""The compressors' MLP as one autograd node on its Triton kernels (nsa.attention.phi_mlp.one_node,
nsa.kernels.phi_mlp), as an eager NSA layer runs it: the outputs and the gradients of every stream
and parameter are the traced MLP's (compress.compress with one_node=False) up to rounding, at
whole and partial chunks, from a later block, for one or two streams, with r = 1 to 4 chunks a
block, in float32 and under float16 autocast; one node in the graph, one launch forward and three
backward with no PyTorch kernel around them; what it keeps; no double backward."""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from nsa.attention import compress
from nsa.attention.config import NSAConfig
from tests.unit.test_phi_mlp import compressors

pytestmark = pytest.mark.triton_interp

#: aten ops that launch no kernel of their own (allocations, views, and wrappers whose work, if
#: any, is an op under them)
_NO_WORK = {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::view", "aten::_unsafe_view",
            "aten::as_strided", "aten::unbind", "aten::select", "aten::slice", "aten::detach", "aten::alias",
            "aten::t", "aten::transpose", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::reshape",
            "aten::contiguous", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::to",
            "aten::_to_copy", "aten::zeros", "aten::zeros_like", "aten::new_zeros"}
_MEMSET = {"aten::zero_", "aten::fill_"}


def _run(comps, xs, first, one_node, autocast=None):
    leaves = [*xs, *(p for c in comps for p in c.parameters())]
    with torch.autocast(xs[0].device.type, dtype=autocast or torch.float16, enabled=autocast is not None):
        out = compress.compress(comps, xs, first, one_node=one_node)
    gen = torch.Generator().manual_seed(1)
    dy = [torch.randn(t.shape, generator=gen).to(t) for t in out]
    return out, torch.autograd.grad(out, leaves, dy)


def _assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """|got - want| <= tol * max |want| (at least tol) everywhere, no NaN (a tile the kernels never
    wrote is NaN: tests/kernels/conftest.py)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert not got.isnan().any(), f"{what}: NaN"
    err = (got.float() - want.float()).abs().max().item()
    assert err <= tol * max(1.0, want.float().abs().max().item()), f"{what}: max |diff| {err:.3g}"


#: (cmp_block, cmp_stride, T, first, B, H, G, K): r = l/d chunks a block from 1 to 4, T not a
#: multiple of the stride (tokens after the last block), blocks from a later one, one stream
CASES = [(8, 4, 70, 0, 2, 3, 2, 8), (8, 4, 64, 1, 1, 2, 2, 16), (4, 4, 9, 0, 1, 2, 2, 8), (12, 4, 41, 0, 2, 1, 1, 8),
         (16, 4, 50, 2, 1, 2, 2, 16), (32, 16, 100, 2, 1, 2, 2, 8)]
#: the launches' tiles and segments: as tuned, and small (several tiles of every loop; segments
#: shorter than a tile of rows, so several of them add their partial sums), with the int64
#: offsets of tensors of 2^31 elements or more
SMALL = dict(BM=16, BC=16, BK=16, num_warps=4, num_stages=2)


@pytest.mark.parametrize("small", [False, True], ids=["tuned", "small tiles, segments, int64 offsets"])
@pytest.mark.parametrize("cmp_block, cmp_stride, T, first, B, H, G, K", CASES)
def test_the_kernels_are_the_traced_mlp(kdev, monkeypatch, small, cmp_block, cmp_stride, T, first, B, H, G, K):
    from nsa.kernels import phi_mlp

    if small:
        monkeypatch.setattr(phi_mlp, "_TILES", SMALL)
        monkeypatch.setattr(phi_mlp, "_SEGMENT_ROWS", 5)
        monkeypatch.setattr(phi_mlp, "wide_offsets", lambda n: True)
    cfg = NSAConfig(cmp_block=cmp_block, cmp_stride=cmp_stride)
    comps = compressors(cfg, K, G, device=kdev)
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(B, T, H, K, generator=gen).to(kdev).requires_grad_() for _ in comps]
    out, grads = _run(comps, xs, first, one_node=True)
    want, want_grads = _run(comps, xs, first, one_node=False)
    assert type(out[0].grad_fn).__name__ == "_PhiMLPBackward"
    tol = 1e-5 if kdev.type == "cpu" else 1e-4
    names = [f"d{name}" for name in ["x"] * G + [n for c in comps for n, _ in c.named_parameters()]]
    for got, ref, name in zip([*out, *grads], [*want, *want_grads], ["out"] * G + names):
        _assert_close(got, ref, tol, name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_under_autocast_the_kernels_keep_the_traced_rounding(kdev, dtype):
    """Parameters float32, streams and products in the autocast dtype: the outputs within its
    rounding, the gradients too, in the parameters' and streams' dtypes."""
    if kdev.type == "cpu" and dtype == torch.bfloat16:
        pytest.skip("the Triton interpreter computes bfloat16 wrongly")
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 16, device=kdev)
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(2, 67, 2, 16, generator=gen).to(kdev, dtype).requires_grad_() for _ in comps]
    out, grads = _run(comps, xs, 1, one_node=True, autocast=dtype)
    want, want_grads = _run(comps, xs, 1, one_node=False, autocast=dtype)
    tol = 4 * torch.finfo(dtype).eps
    for got, ref in zip([*out, *grads], [*want, *want_grads]):
        _assert_close(got, ref, tol, "under autocast")


@pytest.mark.parametrize("G", [1, 2])
def test_one_node_one_launch_forward_three_backward(kdev, monkeypatch, G):
    """The node's forward is one Triton launch and its backward three, with no PyTorch kernel
    (allocations and views aside) and no memset: the traced MLP's casts, sums, stacks and copies
    would show here."""
    from nsa.kernels import phi_mlp

    launches: list[str] = []
    kernel_type = type(phi_mlp._phi_fwd_kernel)
    run = kernel_type.run

    def counted(self, *args, **kwargs):
        launches.append(self.fn.__name__)
        with torch.profiler.record_function("triton launch"):  # the interpreter's copies happen inside
            return run(self, *args, **kwargs)

    monkeypatch.setattr(kernel_type, "run", counted)
    monkeypatch.setattr(torch, "empty", torch._C._VariableFunctions.empty)  # no NaN fills to count
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 8, G, device=kdev)
    xs = [torch.randn(1, 42, 2, 8, device=kdev, requires_grad=True) for _ in comps]
    leaves = [*xs, *(p for c in comps for p in c.parameters())]
    compress.compress(comps, xs, one_node=True)  # compiles on a GPU
    out = []
    fwd = _torch_work(lambda: out.extend(compress.compress(comps, xs, one_node=True)), launches)
    dy = [torch.randn_like(t) for t in out]
    bwd = _torch_work(lambda: torch.autograd.grad(out, leaves, dy), launches)
    assert fwd == (["_phi_fwd_kernel"], [])
    assert bwd == (["_phi_bwd_pre_kernel", "_phi_bwd_main_kernel", "_phi_bwd_sum_kernel"], [])
    assert out[0].grad_fn is out[-1].grad_fn and type(out[0].grad_fn).__name__ == "_PhiMLPBackward"


def _torch_work(fn, launches: list[str]) -> tuple[list[str], list[str]]:
    """The Triton kernels fn() launches, and the aten ops it runs that launch a kernel of their
    own: those called outside a Triton launch, named by the outermost (a memset as 'memset')."""
    launches.clear()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    work = []
    for event in prof.events():
        if not event.name.startswith("aten::") or _under_an_op(event):
            continue
        names, todo = {event.name}, list(event.cpu_children)
        while todo:
            child = todo.pop()
            names.add(child.name)
            todo += child.cpu_children
        ran = {n for n in names if n.startswith("aten::")} - _NO_WORK
        if ran:
            work.append(event.name if ran - _MEMSET else "memset")
    return list(launches), work


def _under_an_op(event) -> bool:
    up = event.cpu_parent
    while up is not None:
        if up.name.startswith("aten::") or up.name == "triton launch":
            return True
        up = up.cpu_parent
    return False


def test_the_node_keeps_fc1s_input_and_pre(kdev):
    """Under autocast with float32 parameters the node keeps fc1's input and pre in the autocast
    dtype (hidden is made again from pre) and the parameters themselves: no float32 copy, no cast
    of a parameter, not the streams."""
    dtype = torch.float16 if kdev.type == "cpu" else torch.bfloat16
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 16, device=kdev)
    xs = [torch.randn(1, 64, 2, 16, device=kdev, dtype=dtype, requires_grad=True) for _ in comps]
    params = {p.untyped_storage().data_ptr() for c in comps for p in c.parameters()}
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast(kdev.type, dtype=dtype):
            out = compress.compress(comps, xs, one_node=True)
    n, m = 15, 16  # blocks of 8 tokens every 4, and chunks of 4 tokens they read
    kept = sorted(tuple(t.shape) for t in saved if t.untyped_storage().data_ptr() not in params)
    assert kept == sorted([(2, 1, m, 2, 4 * 16), (2, 1, n, 2, 16)]), kept
    assert all(t.dtype == dtype for t in saved if t.untyped_storage().data_ptr() not in params)
    assert all(x.untyped_storage().data_ptr() not in {t.untyped_storage().data_ptr() for t in saved} for x in xs)
    assert out[0].dtype == dtype


def test_streams_of_another_16bit_dtype_than_autocasts(kdev):
    """Streams of another 16-bit dtype than autocast's are taken in autocast's, and their
    gradient comes back in their own."""
    stream, autocast = (torch.bfloat16, torch.float16) if kdev.type == "cpu" else (torch.float16, torch.bfloat16)
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 16, device=kdev)
    xs = [torch.randn(1, 64, 2, 16, device=kdev, dtype=stream, requires_grad=True) for _ in comps]
    with torch.autocast(kdev.type, dtype=autocast):
        out = compress.compress(comps, xs, one_node=True)
    assert all(t.dtype == autocast for t in out) and type(out[0].grad_fn).__name__ == "_PhiMLPBackward"
    grads = torch.autograd.grad(out, xs, [torch.ones_like(t) for t in out])
    assert all(g.dtype == stream and g.shape == x.shape for g, x in zip(grads, xs))


def test_double_backward_is_refused_by_name(kdev):
    """A gradient penalty (a backward with create_graph=True) meets the node, whose kernels'
    gradients have no graph of their own: refused with what to do instead, not failed inside
    (under torch.func the MLP runs op by op: tests/unit/test_phi_mlp.py)."""
    cfg = NSAConfig(cmp_block=4, cmp_stride=2)
    comps = compressors(cfg, 8, device=kdev)
    xs = [torch.randn(1, 13, 1, 8, device=kdev, requires_grad=True) for _ in comps]
    out = compress.compress(comps, xs, one_node=True)
    with pytest.raises(RuntimeError, match="no double backward .* under torch.func"):
        torch.autograd.grad(sum(t.square().sum() for t in out), xs[0], create_graph=True)


def test_without_gradients_no_node_and_nothing_kept(kdev):
    """Under no_grad the forward kernel writes the outputs alone: the same values, no node."""
    cfg = NSAConfig(cmp_block=8, cmp_stride=4)
    comps = compressors(cfg, 8, device=kdev)
    xs = [torch.randn(2, 45, 2, 8, device=kdev) for _ in comps]
    with torch.no_grad():
        out = compress.compress(comps, xs, 1, one_node=True)
        want = compress.compress(comps, xs, 1, one_node=False)
    assert all(t.grad_fn is None for t in out)
    for got, ref in zip(out, want):
        _assert_close(got, ref, 1e-5 if kdev.type == "cpu" else 1e-4, "out")
