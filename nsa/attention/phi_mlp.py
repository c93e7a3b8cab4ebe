"""The compressors' MLP phi (nsa.attention.compress), G compressors at once on their stacked
parameters: its math, and that math as one autograd node with a written-out backward for an eager
NSA layer.

fc1 reads fc1's input as compress.fc1_input makes it: each token once, in chunks of d tokens (a
block of l = r*d tokens is r chunks), so block i's pre-activation is the sum of its r chunks'
terms, sum_q terms[i + q, ..., q], plus W1 flatten(pos) + b1 (pos is the same in every block: its
term joins the bias); hidden = silu(pre), out = W2 hidden + b2.

Traced by autograd op by op, the MLP of a layer's key and value compressors is some thirty-five
nodes (the parameters' stack and cast, fc1's chunk views, the block sum's windows, silu, fc2) and
about twenty kernels each way, a sizeable share of an eager layer's host time where the host sets
its pace. ``one_node`` runs the same ops without recording them, so its outputs are the traced
version's bit for bit, and its backward runs the matching products in about fifteen kernels: each
parameter's gradient lands in one buffer, cast once, and the streams' gradient is one copy out of
fc1's chunk layout. The gradients agree with the traced version's up to the rounding of sums taken
in another order; it keeps what the traced version keeps.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

import torch
import torch.nn.functional as F

#: the parameters of one compressor in the order the node takes them
NAMES = ("fc1.weight", "pos", "fc1.bias", "fc2.weight", "fc2.bias")


class _PhiMLP(torch.autograd.Function):
    """apply(geometry, flat, *params, *xs): flat, fc1's input [G, B, m, H, d*K] made from the
    streams xs (G of them, [B, T, H, K]) without gradient; params, the G compressors' NAMES
    parameters, name by name; geometry, (first token read, n blocks, d, compute dtype).
    Returns the G streams' compressed tokens, [B, n, H, K] each (the streams get the gradient
    that flat would pass them). An old-style Function (the context set up in forward), as
    nsa.kernels._autograd's are, for its host time."""

    @staticmethod
    def forward(ctx, geometry, flat, *tensors):
        start, n, d, dtype = geometry
        G = flat.shape[0]
        params, streams = tensors[:len(NAMES) * G], tensors[len(NAMES) * G:]
        w1, pos, b1, w2, b2 = stack(params, G, dtype)
        pre = pre_activation(flat, n, w1, pos, b1)
        hidden = F.silu(pre)
        out = fc2(hidden, w2, b2)
        # what the traced MLP keeps: fc1's input and weight, silu's input, fc2's input and weight
        ctx.save_for_backward(flat, w1, pos, w2, pre, hidden)
        ctx.geometry = geometry
        ctx.params = [(t.shape, t.dtype) for t in params]
        ctx.stream = (streams[0].shape, streams[0].dtype)
        return out.unbind(0)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph: the buffers below are written through out=
            raise RuntimeError(
                "NSA's compressor MLP has no double backward (create_graph=True) on an eager layer's "
                "one-node path; under torch.func (torch.func.grad, vjp, jacrev) the layer runs it op by op, "
                "which has one (or use NSAConfig(phi='mean'))")
        start, n, d, dtype = ctx.geometry
        flat, w1, pos, w2, pre, hidden = ctx.saved_tensors
        G, B, m, H, width = flat.shape
        r = m - n + 1
        K_out = w1.shape[1]
        dout = torch.stack(grads).to(dtype).view(G, -1, w2.shape[1])
        # the parameters' gradients in one buffer of the compute dtype, in stack's layout
        sizes = [w1.numel(), pos.numel(), K_out * G, w2.numel(), w2.shape[1] * G]
        buf = torch.empty(sum(sizes), device=flat.device, dtype=dtype)
        dw1, dpos, db1, dw2, db2 = buf.split(sizes)
        torch.bmm(dout.transpose(1, 2), hidden.flatten(1, -2), out=dw2.view(w2.shape))
        torch.sum(dout, 1, dtype=dtype, out=db2.view(G, -1))
        dpre = torch.ops.aten.silu_backward(torch.bmm(dout, w2).view(pre.shape), pre)
        db1 = torch.sum(dpre.flatten(1, -2), 1, dtype=dtype, out=db1.view(G, K_out))
        torch.bmm(db1.unsqueeze(1), w1.view(G, K_out, -1), out=dpos.view(G, 1, -1))
        # dterms[:, :, c, ..., q] = dpre[:, :, c - q]: the block sum's windows, written out
        dterms = dpre.new_zeros(G, B, m, H, K_out, r)
        for q in range(r):
            dterms[:, :, q:q + n, ..., q] = dpre
        dterms = dterms.view(G, -1, K_out * r)
        w1v = w1.view(G, K_out * r, width)
        torch.baddbmm(torch.bmm(db1.unsqueeze(2), pos.view(G, 1, -1)).view(w1v.shape), dterms.transpose(1, 2),
                      flat.view(G, -1, width), out=dw1.view(w1v.shape))
        dflat = torch.bmm(dterms, w1v)
        # fc1's chunks [G, B, m, H, d, K] back to the streams' tokens [G, B, T, H, K]
        shape, x_dtype = ctx.stream
        T, K = shape[1], shape[3]
        end = start + m * d
        dx = torch.empty(G, B, T, H, K, device=flat.device, dtype=x_dtype)
        dx[:, :, start:end].view(G, B, m, d, H, K).copy_(dflat.view(G, B, m, H, d, K).transpose(3, 4))
        if start > 0 or end < T:
            dx[:, :, :start] = 0
            dx[:, :, end:] = 0
        return (None, None, *_unstack(buf, ctx.params), *dx.unbind(0))


def pre_activation(flat: torch.Tensor, n: int, w1: torch.Tensor, pos: torch.Tensor, b1: torch.Tensor
                   ) -> torch.Tensor:
    """fc1(flatten(block + pos)) [G, B, n, H, K_out] of the n blocks whose fc1 input is ``flat``
    ([G, B, m, H, d*K], compress.fc1_input's), from the G compressors' stacked fc1 parameters."""
    G, B, m, H, width = flat.shape
    r = m - n + 1
    # W1 [K_out, r * width] read as [K_out * r, width]: row o*r + q holds W1_q's row o
    terms = torch.bmm(flat.view(G, -1, width), w1.view(G, -1, width).transpose(1, 2))
    bias = torch.baddbmm(b1.unsqueeze(1), pos.view(G, 1, -1), w1.transpose(1, 2))
    return block_sum(terms.view(G, B, m, H, -1, r)) + bias.view(G, 1, 1, 1, -1)


def block_sum(terms: torch.Tensor) -> torch.Tensor:
    """sum_q terms[:, :, i + q, ..., q] [G, B, n, H, K_out] for each block i of terms [G, B, n + r - 1,
    H, K_out, r]: its chunks' terms, read through windows of r chunks (a view) and their diagonal,
    one reduction each way (slices would each build and add a gradient of all the terms). The
    dtype is named: CUDA's autocast would sum into float32, and silu would then keep a float32
    copy for its backward."""
    r = terms.shape[-1]
    return terms.unfold(2, r, 1).diagonal(dim1=-2, dim2=-1).sum(-1, dtype=terms.dtype)


def fc2(hidden: torch.Tensor, w2: torch.Tensor, b2: torch.Tensor) -> torch.Tensor:
    """W2 hidden + b2 [G, B, n, H, K] of hidden [G, B, n, H, K_out]."""
    return torch.baddbmm(b2.unsqueeze(1), hidden.flatten(1, -2), w2.transpose(1, 2)).view(*hidden.shape[:-1], -1)


def stack(params: Sequence[torch.Tensor], G: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """params (G compressors' parameters, name by name: G of the first name, then of the next)
    stacked per name [G, ...] in dtype: one concatenation and one cast for all, each way
    (autocast would cast each on its own, and slices of one buffer would each get a gradient of
    the whole buffer)."""
    flat = torch.cat([p.reshape(-1) for p in params]).to(dtype)
    groups = [params[i:i + G] for i in range(0, len(params), G)]
    parts = flat.split([g[0].numel() * G for g in groups])
    return [part.view(G, *g[0].shape) for part, g in zip(parts, groups)]


def _unstack(buf: torch.Tensor, params: list[tuple[torch.Size, torch.dtype]]) -> list[torch.Tensor]:
    """The parameters' gradients from buf (``stack``'s layout): views of one cast copy."""
    buf = buf.to(params[0][1])
    out, at = [], 0
    for shape, _ in params:
        size = shape.numel()
        out.append(buf[at:at + size].view(shape))
        at += size
    return out


def one_node(compressors: Sequence, xs: Sequence[torch.Tensor], flat: torch.Tensor, start: int, n: int, d: int,
             dtype: torch.dtype) -> list[torch.Tensor]:
    """The compressed tokens of each stream in xs ([B, n, H, K] each) from flat, fc1's input made
    from xs from token ``start`` without gradient (compress.fc1_input), through the
    compressors' MLP as one autograd node."""
    params = [attrgetter(name)(c) for name in NAMES for c in compressors]
    return list(_PhiMLP.apply((start, n, d, dtype), flat, *params, *xs))
