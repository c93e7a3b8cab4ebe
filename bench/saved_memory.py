"""What NSA attention and dense attention of the same shape keep for their backward, tensor by
tensor, and what the whole model holds at its peak: the question behind "NSA memory <= dense".

For one attention layer (bf16 autocast, gradients of the input and every parameter) it lists each
storage that autograd saves during the forward, parameters left out, deduplicated by storage (a
view saved twice counts once), in bytes per token, with the op that produced it; then, for the
layer and for the preset's model (forward, cross entropy, backward), the memory the forward leaves
allocated (its activations) and the peak above that during the backward, in GB.

The listing counts through saved-tensor hooks of its own, and an NSA layer defers to a caller's
hooks: under them it keeps q, the key/value streams, the window branch's output and the gated sum
even from 32k tokens, where it otherwise keeps how to make them again
(nsa.attention.compress.RECOMPUTE_TOKENS, nsa.attention.remade). The listing then shows those
tensors; the layer and model parts, which set no hooks, measure the layer as it runs.

    python bench/saved_memory.py                       # 32k, m7c_125m
    python bench/saved_memory.py --lengths 32k 64k --parts layer
"""
from __future__ import annotations

import argparse
import collections
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nsa_vs_dense import KINDS, _config, length  # noqa: E402
from nsa.attention import NSAAttention, graphed  # noqa: E402
from nsa.attention.dense import DenseAttention  # noqa: E402
from nsa.model.model import NSATransformer  # noqa: E402


@dataclass(frozen=True)
class Saved:
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    producer: str  # the grad_fn of the saved tensor, or what it is when it has none


def saved_by(fn, exclude: set[int]) -> list[Saved]:
    """The storages autograd saves while fn() runs, largest first; storages in ``exclude``
    (data_ptrs: the parameters) left out."""
    seen: dict[int, Saved] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in exclude and key not in seen:
            producer = type(t.grad_fn).__name__ if t.grad_fn is not None else (
                "leaf" if t.requires_grad else "no grad")
            seen[key] = Saved(storage.nbytes(), tuple(t.shape), t.dtype, producer)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sorted(seen.values(), key=lambda s: -s.nbytes)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f}"


def forward_and_backward(forward) -> tuple[int, int]:
    """(bytes the forward leaves allocated, peak bytes above that during the backward)."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    loss = forward()
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    return after - base, torch.cuda.max_memory_allocated() - after


def layer(kind: str, S: int, model_name: str, device: torch.device):
    cfg = _config(model_name, kind)
    args = (cfg.dim, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.attn, cfg.rope_theta)
    module = (NSAAttention(*args, graph_tokens=0) if kind == "nsa" else DenseAttention(*args)).to(device)
    x = torch.randn(1, S, cfg.dim, device=device, requires_grad=True)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return module(x).float().square().mean()

    return module, forward


def model(kind: str, S: int, model_name: str, device: torch.device):
    cfg = _config(model_name, kind)
    torch.manual_seed(0)
    net = NSATransformer(cfg).to(device)
    graphed.set_graph_tokens(net, 0)
    tokens = torch.randint(0, cfg.vocab_size, (1, S + 1), device=device)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = net(tokens[:, :-1])
        return F.cross_entropy(logits.float().view(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))

    return net, forward


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", nargs="+", type=length, default=[length("32k")])
    ap.add_argument("--parts", nargs="+", default=["saved", "layer", "model"], choices=["saved", "layer", "model"])
    ap.add_argument("--model", default="m7c_125m", help="the model preset whose shape is measured")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("this benchmark needs a CUDA GPU")
    device = torch.device("cuda")
    for S in args.lengths:
        for kind in KINDS:
            if "saved" in args.parts:
                for part, build in (("layer", layer), ("model", model)):
                    module, forward = build(kind, S, args.model, device)
                    forward()  # routes resolved and kernels compiled outside the count
                    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
                    rows = collections.Counter(saved_by(forward, params))
                    print(f"# {kind} {part} at S={S}: what autograd saves, bytes per token (x how many)")
                    for s, n in sorted(rows.items(), key=lambda r: -r[0].nbytes * r[1]):
                        print(f"  {s.nbytes * n / S:9.1f}  x{n:<3d} {s.producer:32s} {str(s.dtype):15s} {list(s.shape)}")
                    print(f"  {sum(s.nbytes * n for s, n in rows.items()) / S:9.1f}  in all", flush=True)
                    del module, forward
                    gc.collect()
                    torch.cuda.empty_cache()
            for part, build in (("layer", layer), ("model", model)):
                if part not in args.parts:
                    continue
                _, forward = build(kind, S, args.model, device)
                forward_and_backward(forward)
                kept, peak = forward_and_backward(forward)
                print(f"# {kind} {part} at S={S}: forward leaves {_gb(kept)} GB ({kept / S:.0f} B/token), "
                      f"backward peaks {_gb(peak)} GB above that", flush=True)
                del forward
                gc.collect()
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
