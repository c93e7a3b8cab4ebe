"""What holds the memory at the peak of the preset model's training step: the tensors alive at
that moment, by where they were allocated, largest first, and the allocation that reached it.

It records the CUDA caching allocator's history for one step (after a first step, which compiles
and tunes), replays the allocations and frees to find the peak, and groups the blocks alive there
by the first frame of this project or of inductor's generated code (with its source line), so
two checkouts' peaks can be compared line by line (bench/gpu/checkout_peaks.sh runs a script
from each checkout's bench/). Memory allocated before the recorded step (parameters, optimizer
state) is counted as one "before the step" row.

    python bench/peak_holders.py --lengths 128k --compiled
    python bench/peak_holders.py --lengths 32k --rows 40
    python bench/peak_holders.py --lengths 32k --compiled --segments   # where the reserve grew

With ``--segments`` it lists instead each segment the allocator took from the GPU during the step
(what the peak reserved is made of): its size, the allocation that asked for it, and how much the
allocator held cached but unallocated at that moment (memory it could not fit the request into:
its blocks too small, split, or another stream's or pool's).
"""
from __future__ import annotations

import argparse
import collections
import linecache
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nsa_vs_dense import _free, model_step, model_step_args  # noqa: E402

#: path parts of the frames a block is attributed to, the first one found from the innermost
OWN = ("/nsa/", "torchinductor", "/bench/")


def _origin(frames: list[dict]) -> str:
    for f in frames:
        name = f["filename"]
        if any(part in name for part in OWN):
            text = linecache.getline(name, f["line"]).strip()
            short = name.split("/nsa/", 1)[-1] if "/nsa/" in name else Path(name).name
            return f"{short}:{f['line']} {f['name']}: {text[:110]}"
    f = frames[0] if frames else {"filename": "?", "line": 0, "name": "?"}
    return f"{Path(f['filename']).name}:{f['line']} {f['name']}"


def _peak(trace: list[dict]) -> tuple[int, int]:
    """(index of the event that reached the peak, bytes above the start there)."""
    live, total, best, at = {}, 0, -1, -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
            total += e["size"]
            if total > best:
                best, at = total, i
        elif e["action"] == "free_completed" and e["addr"] in live:
            total -= live.pop(e["addr"])
    return at, best


def holders(trace: list[dict], upto: int) -> dict[int, dict]:
    live: dict[int, dict] = {}
    for e in trace[: upto + 1]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return live


def segments(trace: list[dict], allocated: int, reserved: int, rows: int) -> None:
    """Print the segments taken from the GPU during ``trace``, largest first, with what was cached
    and unallocated when each was taken (starting from ``allocated`` and ``reserved`` bytes)."""
    live: dict[int, int] = {}
    taken = []
    peak = reserved
    for e in trace:
        action = e["action"]
        if action == "alloc":
            live[e["addr"]] = e["size"]
            allocated += e["size"]
        elif action == "free_completed":  # a block allocated before the step is counted in allocated too
            allocated -= live.pop(e["addr"], e["size"])
        elif action in ("segment_alloc", "segment_map"):
            taken.append((e["size"], reserved - allocated, reserved + e["size"], _origin(e["frames"])))
            reserved += e["size"]
            peak = max(peak, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
    print(f"# {len(taken)} segments taken, {sum(t[0] for t in taken) / 1e9:.3f} GB; peak reserved {peak / 1e9:.3f} GB")
    print("| segment MB | cached unallocated then, MB | reserved after, GB | asked for at |\n|---:|---:|---:|---|")
    for size, cached, after, origin in sorted(taken, key=lambda t: -t[0])[:rows]:
        print(f"| {size / 1e6:.1f} | {cached / 1e6:.1f} | {after / 1e9:.3f} | {origin.replace('|', '/')} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model_step_args(ap, "128k")
    ap.add_argument("--kind", default="nsa", choices=("nsa", "dense"))
    ap.add_argument("--rows", type=int, default=30, help="origins listed, largest first")
    ap.add_argument("--segments", action="store_true", help="list the segments the step took from the GPU instead")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    device = torch.device("cuda")
    for S in args.lengths:
        torch._dynamo.reset()
        model, run = model_step(args.kind, S, args.model, device, args.compiled)
        run()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        reserved_before = torch.cuda.memory_reserved()
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
        run()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = torch.cuda.max_memory_allocated()
        trace = snap["device_traces"][torch.cuda.current_device()]
        if args.segments:
            print(f"# S={S // 1024}k {'compiled' if args.compiled else 'eager'} {args.kind}: peak {peak / 1e9:.2f} GB "
                  f"allocated, {torch.cuda.max_memory_reserved() / 1e9:.2f} GB reserved; before the step "
                  f"{before / 1e9:.2f} GB allocated, {reserved_before / 1e9:.2f} GB reserved")
            segments(trace, before, reserved_before, args.rows)
            del model, run, snap, trace
            _free()
            continue
        at, above = _peak(trace)
        live = holders(trace, at)
        print(f"# S={S // 1024}k {'compiled' if args.compiled else 'eager'} {args.kind}: peak {peak / 1e9:.2f} GB "
              f"allocated; before the step {before / 1e9:.2f} GB; the trace's peak {above / 1e9:.2f} GB above it "
              f"at event {at} of {len(trace)}")
        reached = trace[at]
        print(f"# reached by {reached['size'] / 1e6:.1f} MB at:")
        for f in reached["frames"]:
            if any(part in f["filename"] for part in OWN) or "autograd" in f["filename"]:
                print(f"#   {_origin([f])}")
        by = collections.defaultdict(lambda: [0, 0])
        for e in live.values():
            row = by[_origin(e["frames"])]
            row[0] += e["size"]
            row[1] += 1
        print(f"| GB | blocks | allocated at |\n|---:|---:|---|\n| {before / 1e9:.3f} | - | before the step |")
        for origin, (size, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[: args.rows]:
            print(f"| {size / 1e9:.3f} | {n} | {origin.replace('|', '/')} |")
        del model, run, snap, trace, live
        _free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
