"""Inputs of the NSA core for the benchmarks, and how local their selections are.

* random: normal q, compressed and per-token k/v, gates in (0, 1) (what the kernel tables of
  docs/performance.md run on). Their top-n picks blocks that neighbouring
  tokens hardly share beyond the three forced ones.
* trained: the q, k, v and gates one layer of a trained model makes on real text, written by
  bench/trained_inputs.py as ``<dir>/layer<L>_S<S>.pt``; their selections carry the structure
  of language (neighbouring tokens choose many of the same blocks).

Locality: for tiles of T consecutive tokens of one KV head, the number of distinct blocks in
the union of their selections (T * n if no two tokens share a block, n if all share all).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from nsa.attention.config import NSAConfig
from nsa.attention.torch_branches import visible_compressed

LOCALITY_TILES = (16, 32, 64)
#: the core's inputs, as nsa.attention.core.nsa_core takes them (gates last)
CORE_INPUTS = ("q", "kc", "vc", "k_sel", "v_sel", "k_win", "v_win", "gates")


@dataclass
class CoreInputs:
    q: torch.Tensor
    kc: torch.Tensor
    vc: torch.Tensor
    k_sel: torch.Tensor
    v_sel: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor
    gates: torch.Tensor
    do: torch.Tensor
    """The upstream gradient of the core's output (random either way)."""
    source: str
    """'random', or 'trained layer L' (the file's model layer)."""

    def leaves(self) -> list[torch.Tensor]:
        """The core's inputs, each a leaf that requires grad, in nsa_core's order."""
        return [getattr(self, n) for n in CORE_INPUTS]

    def shape(self) -> tuple[int, int, int, int, int]:
        """(B, S, HQ, H, K)."""
        B, S, HQ, K = self.q.shape
        return B, S, HQ, self.k_sel.shape[2], K


def random_inputs(B: int, S: int, HQ: int, H: int, K: int, cfg: NSAConfig, seed: int = 0,
                  dtype: torch.dtype = torch.bfloat16) -> CoreInputs:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(dtype).requires_grad_()

    Nc = int(visible_compressed(torch.tensor([S - 1]), cfg).item())
    gates = torch.sigmoid(torch.randn(B, S, HQ, 3, generator=g, device="cuda")).to(dtype).requires_grad_()
    return CoreInputs(q=rnd(B, S, HQ, K), kc=rnd(B, Nc, H, K), vc=rnd(B, Nc, H, K), k_sel=rnd(B, S, H, K),
                      v_sel=rnd(B, S, H, K), k_win=rnd(B, S, H, K), v_win=rnd(B, S, H, K), gates=gates,
                      do=torch.randn(B, S, HQ, K, generator=g, device="cuda").to(dtype), source="random")


def trained_path(directory: str | Path, layer: int, S: int) -> Path:
    return Path(directory) / f"layer{layer}_S{S}.pt"


def trained_inputs(directory: str | Path, layer: int, S: int, seed: int = 0) -> CoreInputs:
    """The inputs bench/trained_inputs.py saved for this layer and length (on the GPU, leaves
    that require grad), with a random upstream gradient."""
    saved = torch.load(trained_path(directory, layer, S), map_location="cuda", weights_only=True)
    x = {n: saved[n].requires_grad_() for n in CORE_INPUTS}
    g = torch.Generator(device="cuda").manual_seed(seed)
    do = torch.randn(x["q"].shape, generator=g, device="cuda").to(x["q"].dtype)
    return CoreInputs(**x, do=do, source=f"trained layer {layer}")


def selection(x: CoreInputs, cfg: NSAConfig) -> torch.Tensor:
    """The blocks the Triton top-n selects for these inputs, [B, S, H, n]."""
    from nsa.attention.kernel_branches import triton_cmp_attention, triton_select_blocks

    with torch.no_grad():
        _, lse = triton_cmp_attention(x.q, x.kc, x.vc, cfg)
        return triton_select_blocks(x.q, x.kc, lse, cfg)


def locality(idx: torch.Tensor, tiles=LOCALITY_TILES) -> dict[int, float]:
    """Mean distinct blocks per tile of T consecutive tokens and KV head, for each T of
    ``tiles`` (the last partial tile of a sequence left out)."""
    B, S, H, n = idx.shape
    out = {}
    for T in tiles:
        m = S // T
        if m == 0:
            continue
        u = idx[:, :m * T].reshape(B, m, T, H, n).permute(0, 1, 3, 2, 4).reshape(B, m, H, T * n)
        u = u.sort(-1).values
        distinct = (u[..., :1] >= 0).sum(-1) + ((u[..., 1:] != u[..., :-1]) & (u[..., 1:] >= 0)).sum(-1)
        out[T] = distinct.float().mean().item()
    return out


def describe_locality(idx: torch.Tensor, n: int) -> str:
    """'distinct blocks per tile: 16 tok 41.2 (16%), ...': the share is of T * n, the blocks a
    tile would load if its tokens shared none."""
    return ", ".join(f"{T} tok {d:.1f} ({d / (T * n):.0%})" for T, d in locality(idx).items())
