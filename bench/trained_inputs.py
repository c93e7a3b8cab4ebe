#!/usr/bin/env python
"""Benchmark inputs with real selection structure: train the seeds' model shape (m7c_125m)
briefly on real long text, then save the q, k, v and gates that chosen layers make on a
held-out stretch of the same text, for bench/bench_nsa.py --inputs trained:DIR.

The text is the Python standard library's own .py sources, read in place from
``sysconfig.get_paths()['stdlib']`` (every machine has them; nothing is downloaded or copied
into the repository), in sorted order, without the third-party packages some installations keep
under that directory (site-packages, dist-packages), byte-tokenised (UTF-8 bytes, a NUL between
files, as the trainer's text reader does).

    python bench/trained_inputs.py --out /tmp/trained --steps 300 --train-seq 16384 \\
        --lengths 16384 32768 65536 --layers 2 6 10
    python bench/trained_inputs.py --out /tmp/t --config tiny --device cpu --steps 3 --train-seq 64 \\
        --lengths 64 --layers 0          # a smoke test on CPU

writes ``<out>/layer<L>_S<S>.pt`` (bf16 tensors of the NSA core's inputs, batch 1) and
``<out>/train_loss.txt`` (the loss of every step). The training loop is the trainer's step in
small: bf16 autocast, AdamW (fused on CUDA), linear warm-up, gradient clip 1.0.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.inputs import CORE_INPUTS, trained_path  # noqa: E402
from nsa.model import NSATransformer  # noqa: E402
from nsa.model.config import load_model_config  # noqa: E402

NOT_STDLIB = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_sources() -> list[Path]:
    """The standard library's .py files, sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in NOT_STDLIB]
        found += [Path(directory) / n for n in names if n.endswith(".py")]
    return sorted(found)


class TextStream:
    """The standard library's bytes as tokens, file after file, a NUL after each, round and round."""

    def __init__(self):
        self._files = itertools.cycle(stdlib_sources())
        self._buf = bytearray()

    def take(self, n: int) -> torch.Tensor:
        """The next n tokens [n] (int64)."""
        while len(self._buf) < n:
            self._buf += next(self._files).read_bytes() + b"\0"
        out = torch.frombuffer(bytes(self._buf[:n]), dtype=torch.uint8).long()
        del self._buf[:n]
        return out


def train(model: NSATransformer, text: TextStream, seq_len: int, steps: int, device: torch.device, out: Path) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=device.type == "cuda")
    losses = []
    t0 = time.time()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 6e-4 * min(1.0, (step + 1) / 50)
        row = text.take(seq_len + 1).to(device)[None]
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = model(row[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), row[0, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step + 1}/{steps} loss {losses[-1]:.3f} ({time.time() - t0:.0f} s)", flush=True)
    (out / "train_loss.txt").write_text("\n".join(f"{x:.4f}" for x in losses) + "\n")


def capture(model: NSATransformer, tokens: torch.Tensor, out: Path, lengths: list[int], layers: list[int]) -> None:
    """Save the core's inputs of each of ``layers`` for the first S tokens, each S of lengths."""
    model.eval()
    autocast = torch.autocast(tokens.device.type, dtype=torch.bfloat16)
    for S in lengths:
        for layer in layers:
            attn = model.layers[layer].attn
            saved: dict[str, torch.Tensor] = {}

            def grab(module, args, saved=saved, attn=attn):
                q, kv, gates = attn.project(args[0], 0)
                saved.update(q=q, k_sel=kv[2], v_sel=kv[3], k_win=kv[4], v_win=kv[5], gates=gates,
                             kc=attn.compress_k(kv[0]), vc=attn.compress_v(kv[1]))
                raise _Captured

            handle = attn.register_forward_pre_hook(grab)
            try:
                with torch.no_grad(), autocast:
                    model(tokens[:, :S])
            except _Captured:
                pass
            finally:
                handle.remove()
            data = {n: saved[n].to(torch.bfloat16).contiguous() for n in CORE_INPUTS}
            torch.save(data, trained_path(out, layer, S))
            print(f"# saved layer {layer}, S={S}: q {tuple(data['q'].shape)}", flush=True)


class _Captured(Exception):
    """Stops the model's forward once the layer's input is captured."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the inputs and the loss curve")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--train-seq", type=int, default=16384)
    p.add_argument("--lengths", type=int, nargs="+", default=[16384, 32768, 65536])
    p.add_argument("--layers", type=int, nargs="+", default=[6])
    p.add_argument("--config", default="m7c_125m", help="model preset (m7c_125m: the seeds' shape)")
    p.add_argument("--device", default="cuda")
    a = p.parse_args(argv)
    out, device = Path(a.out), torch.device(a.device)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = NSATransformer(load_model_config(a.config)).to(device)
    text = TextStream()
    train(model, text, a.train_seq, a.steps, device, out)
    held_out = text.take(max(a.lengths))  # the text after the training's
    capture(model, held_out.to(device)[None], out, a.lengths, a.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
