"""The compressors' MLP phi (nsa.attention.compress), G compressors at once on their stacked
parameters: its math, traced op by op, and that math as one autograd node on the Triton kernels
(nsa.kernels.phi_mlp) for an eager NSA layer.

fc1 reads fc1's input as compress.fc1_input makes it: each token once, in chunks of d tokens (a
block of l = r*d tokens is r chunks), so block i's pre-activation is the sum of its r chunks'
terms, sum_q terms[i + q, ..., q], plus W1 flatten(pos) + b1 (pos is the same in every block: its
term joins the bias); hidden = silu(pre), out = W2 hidden + b2.

Traced by autograd op by op, the MLP of a layer's key and value compressors is some thirty-five
nodes (the parameters' stack and cast, fc1's chunk views, the block sum's windows, silu, fc2) and
about twenty kernels each way, a sizeable share of an eager layer's host time where the host sets
its pace. ``one_node`` runs it as one node of one kernel forward and three backward: the kernels
read the streams, the parameters (cast as the traced MLP casts them) and the outputs' gradients
where they are, and write each gradient where autograd takes it. The outputs and gradients agree
with the traced version's up to the rounding of sums taken in another order; it keeps what the
traced version keeps of the streams (fc1's input, which the forward writes, and pre).
"""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

import torch

#: the parameters of one compressor in the order the node takes them
NAMES = ("fc1.weight", "pos", "fc1.bias", "fc2.weight", "fc2.bias")


class _PhiMLP(torch.autograd.Function):
    """apply((first, n, d), *params, *xs): the compressed tokens of the G streams xs ([B, T, H,
    K] each, the compute dtype) through the G compressors' NAMES parameters (name by name), n
    blocks from block ``first`` every d tokens: [B, n, H, K] each, then fc1's input [G, B, m, H,
    d*K] (no gradient), which the backward reads. An old-style Function (the context set up in
    forward), as nsa.kernels._autograd's are, for its host time."""

    @staticmethod
    def forward(ctx, geometry, *tensors):
        from nsa.kernels.phi_mlp import phi_mlp_forward

        first, n, d = geometry
        G = len(tensors) // (len(NAMES) + 1)
        params, xs = tensors[:-G], tensors[-G:]
        out, flat, pre = phi_mlp_forward(xs, params, first, n, d, keep=True)
        # fc1's input and pre (hidden is silu(pre) again); W1, pos and W2 as they are
        ctx.save_for_backward(flat, pre, *params[:2 * G], *params[3 * G:4 * G])
        ctx.geometry = (first, xs[0].shape[1], [(t.shape, t.dtype) for t in params])
        ctx.mark_non_differentiable(flat)
        # no zero-filled gradient for fc1's input, which has none
        ctx.set_materialize_grads(False)
        return (*out.unbind(0), flat)

    @staticmethod
    def backward(ctx, *grads):
        if torch.is_grad_enabled():  # create_graph: the kernels' gradients have no graph of their own
            raise RuntimeError(
                "NSA's compressor MLP has no double backward (create_graph=True) on an eager layer's "
                "one-node path; under torch.func (torch.func.grad, vjp, jacrev) the layer runs op by op, "
                "which has one")
        from nsa.kernels.phi_mlp import phi_mlp_backward

        first, T, params = ctx.geometry
        flat, pre, *weights = ctx.saved_tensors
        douts = [torch.zeros(pre.shape[1:-1] + params[-1][0], device=pre.device, dtype=pre.dtype)
                 if g is None else g for g in grads[:-1]]  # an output that got no gradient
        buf, dx = phi_mlp_backward(douts, flat, pre, weights, first, T, params[0][1])
        return (None, *_unstack(buf, params), *dx.unbind(0))


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
    """The parameters' gradients from buf (NAMES's sizes in its order): views of it."""
    out, at = [], 0
    for shape, _ in params:
        size = shape.numel()
        out.append(buf[at:at + size].view(shape))
        at += size
    return out


def one_node(compressors: Sequence, xs: Sequence[torch.Tensor], first: int, n: int, d: int
             ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The compressed tokens of each stream in xs ([B, T, H, K] each, the compute dtype; [B, n, H,
    K] each) of n blocks from block ``first`` every d tokens, through the compressors' MLP as one
    autograd node on the Triton kernels; and fc1's input, which the node keeps for its backward
    (None where no gradient is recorded: then neither it nor the node is made)."""
    params = [attrgetter(name)(c) for name in NAMES for c in compressors]
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (*params, *xs))):
        from nsa.kernels.phi_mlp import phi_mlp_forward

        return list(phi_mlp_forward(xs, params, first, n, d, keep=False)[0].unbind(0)), None
    *out, flat = _PhiMLP.apply((first, n, d), *params, *xs)
    return out, flat
