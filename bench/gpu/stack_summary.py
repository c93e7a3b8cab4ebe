"""Sum py-spy's raw (collapsed) stacks by frame: for each function, the share of the samples whose
stack holds it (inclusive) and in which it is the innermost frame (self), the largest first.

    python bench/gpu/stack_summary.py STACKS_RAW [--only PATTERN] [--exclude PATTERN ...] [--top 40]

--only keeps the stacks with a frame containing the pattern (the steps' loop, for one); --exclude
drops every stack with a frame containing one of its patterns (compilation, for one).
"""
from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw", type=Path)
    ap.add_argument("--only", default="")
    ap.add_argument("--exclude", nargs="*", default=[])
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    inclusive, own, total, dropped = Counter(), Counter(), 0, 0
    for line in args.raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if (args.only and not any(args.only in frame for frame in frames)) or \
                any(p in frame for p in args.exclude for frame in frames):
            dropped += int(count)
            continue
        total += int(count)
        for frame in set(frames):
            inclusive[frame] += int(count)
        own[frames[-1]] += int(count)
    print(f"# {total} samples kept, {dropped} dropped (--only {args.only!r}, --exclude {' '.join(args.exclude)})")
    print("| inclusive | self | frame |\n|---:|---:|---|")
    for frame, n in inclusive.most_common(args.top):
        print(f"| {n / total:6.1%} | {own[frame] / total:6.1%} | {frame[:150]} |")


if __name__ == "__main__":
    main()
