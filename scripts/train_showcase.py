#!/usr/bin/env python
"""The seed runbook's command line, mapped onto the config-driven trainer (nsa.train).

    CONFIG=m7c_125m NSA_DDP_BUCKET_MB=50 torchrun --nproc_per_node=2 scripts/train_showcase.py \\
        --dataset synthetic --ddp 1 --steps 300

Every flag becomes a dotted config override (shown at start-up); the environment toggles
(NSA_*, CONFIG) are read by nsa.train.config as for ``python -m nsa.train``. Unknown flags are
an error, not silently dropped. See ``--help``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the runbook sets PYTHONPATH=.; not required

from nsa.train.cli import config_parser, run  # noqa: E402

DATASETS = {"synthetic": "synthetic", "pattern": "pattern", "text": "text", "parquet": "parquet",
            "jsonl": "jsonl", "fineweb_edu": "fineweb_edu"}


def build_parser() -> argparse.ArgumentParser:
    p = config_parser("scripts/train_showcase.py",
                      "Seed-runbook front end of nsa.train: each flag below is a config override.")
    p.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                   help="data.dataset. fineweb_edu/parquet/jsonl/text read local files named by "
                        "data.path (e.g. --override data.path=/data/fwe/*.parquet); nothing is downloaded")
    p.add_argument("--ddp", type=int, choices=(0, 1), default=None,
                   help="1: dist.mode=ddp (under torchrun); 0: dist.mode=single (one process only)")
    p.add_argument("--fsdp", type=int, choices=(0, 1), default=None, help="1: dist.mode=fsdp (FSDP2)")
    p.add_argument("--steps", type=int, default=None, help="train.steps")
    p.add_argument("--loader-timeout", type=float, default=None, help="data.loader_timeout_s (seconds)")
    p.add_argument("--seq-len", type=int, default=None, help="train.seq_len")
    p.add_argument("--batch-size", type=int, default=None, help="train.batch_size (per rank, per micro-batch)")
    p.add_argument("--out-dir", default=None, help="train.out_dir")
    p.add_argument("--override", action="append", default=[], metavar="'KEY=VALUE ...'",
                   help="dotted config overrides, space separated, repeatable; one that disagrees with a flag "
                        "above (or another override) of its key is refused")
    return p


def to_overrides(args: argparse.Namespace) -> list[str]:
    if args.ddp == 1 and args.fsdp == 1:
        raise SystemExit("error: --ddp 1 and --fsdp 1 are exclusive")
    out = list(args.override)
    flags = {
        "data.dataset": DATASETS.get(args.dataset) if args.dataset else None,
        "dist.mode": "fsdp" if args.fsdp == 1 else {1: "ddp", 0: "single"}.get(args.ddp),
        "train.steps": args.steps,
        "data.loader_timeout_s": args.loader_timeout,
        "train.seq_len": args.seq_len,
        "train.batch_size": args.batch_size,
        "train.out_dir": args.out_dir,
    }
    out += [f"{k}={v}" for k, v in flags.items() if v is not None]
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides = to_overrides(args)
    if os.environ.get("RANK", "0") == "0":
        print(f"[showcase] overrides: {' '.join(overrides) or '(none)'}", flush=True)
    return run(args.config, overrides)


if __name__ == "__main__":
    sys.exit(main())
