"""What limits each kernel of one NSA core forward+backward, from the GPU's hardware counters
(Nsight Compute, ``ncu``, which the device image has; nothing here needs Nsight Systems).

Runs itself under ncu with ``--workload``: a few warm-up steps of the registry's op (bench/ops.py,
random inputs, bench/bench_nsa.py's shape names), then one step between cudaProfilerStart and
cudaProfilerStop, so ncu profiles that step's kernels alone, at the clocks the GPU runs at
(``--clock-control none``). Then prints, per kernel launch in order: duration, DRAM traffic and
bandwidth, the SM's and DRAM's throughput as a share of peak, issue slots used, achieved
occupancy, registers a thread, the busiest pipes and the two largest warp stall reasons. ncu's
whole CSV goes to ``--csv``.

    python3 bench/kernel_counters.py --shapes m7c@64k --csv /tmp/ncu.csv
    python3 bench/kernel_counters.py --table /tmp/ncu.csv        # the table of an earlier run
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: ncu sections whose metrics the table reads
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "WarpStateStats")
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"


def workload(shape: str, op: str, warmup: int) -> None:
    """One step of ``op`` at ``shape`` between cudaProfilerStart and Stop, after ``warmup`` steps."""
    import torch

    from bench.bench_nsa import shape_of
    from bench.inputs import random_inputs
    from bench.ops import OPS
    from nsa.attention.config import NSAConfig

    cfg = NSAConfig()
    x = random_inputs(*shape_of(shape), cfg)
    fwd, leaves = OPS[op].build(x, cfg)

    def step():
        out = fwd()
        if OPS[op].backward:
            torch.autograd.grad(out, leaves, x.do)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    step()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def run_ncu(shape: str, op: str, warmup: int, csv: Path) -> None:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--page", "raw",
           "--print-units", "base",
           *[a for s in SECTIONS for a in ("--section", s)],
           sys.executable, __file__, "--workload", "--shapes", shape, "--op", op, "--warmup", str(warmup)]
    with open(csv, "w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    if done.returncode:
        sys.exit(f"ncu failed ({done.returncode}): {done.stderr[-2000:]}")


def _number(value) -> float:
    try:
        return float(str(value).replace(",", ""))
    except ValueError:
        return float("nan")


def table(csv: Path) -> None:
    """The per-kernel table of an ncu raw-page CSV in base units (a header row, a units row,
    one row a launch; ncu's own messages before the header are skipped)."""
    from io import StringIO

    import pandas as pd

    lines = csv.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{csv}: no ncu raw-page header (a line starting with \"ID\")")
    frame = pd.read_csv(StringIO("\n".join(lines[start:])), low_memory=False).iloc[1:]  # after the units row

    def col(name: str, scale: float = 1.0):
        return frame[name].map(_number) * scale if name in frame else pd.Series(float("nan"), index=frame.index)

    dur = col("gpu__time_duration.sum", 1e-3)  # ns -> us
    gb = col("dram__bytes.sum.per_second", 1e-9) * dur * 1e-6  # bytes read and written
    pipes = [c for c in frame.columns if c.startswith("sm__inst_executed_pipe_") and ".avg.pct_of_peak_sustained_active" in c]
    stalls = [c for c in frame.columns if c.startswith(STALL_PREFIX) and c.endswith(STALL_SUFFIX)]
    total = dur.sum()
    print(f"{len(frame)} launches, {total / 1e3:.3f} ms in all (ncu's replay times, clocks as found)")
    print("| # | kernel | us | share | DRAM GB | GB/s | DRAM % | L2 % | SM % | issue % | occupancy % | regs | pipes % "
          "| stalls (cycles a issue) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for i, (idx, row) in enumerate(frame.iterrows()):
        busiest = sorted(((_number(row[c]), c[len("sm__inst_executed_pipe_"):].split(".")[0]) for c in pipes),
                         reverse=True)[:3]
        worst = sorted(((_number(row[c]), c[len(STALL_PREFIX):-len(STALL_SUFFIX)]) for c in stalls), reverse=True)[:2]
        name = str(row.get("Kernel Name", "?"))[:60]
        print(f"| {i} | {name} | {dur[idx]:.1f} | {dur[idx] / total:.1%} | {gb[idx]:.3f} | "
              f"{gb[idx] / dur[idx] * 1e6:.0f} | {col('gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed')[idx]:.0f} | "
              f"{col('lts__throughput.avg.pct_of_peak_sustained_elapsed')[idx]:.0f} | "
              f"{col('sm__throughput.avg.pct_of_peak_sustained_elapsed')[idx]:.0f} | "
              f"{col('sm__issue_active.avg.pct_of_peak_sustained_elapsed')[idx]:.0f} | "
              f"{col('sm__warps_active.avg.pct_of_peak_sustained_active')[idx]:.0f} | "
              f"{col('launch__registers_per_thread')[idx]:.0f} | "
              f"{', '.join(f'{n} {v:.0f}' for v, n in busiest)} | {', '.join(f'{n} {v:.1f}' for v, n in worst)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="m7c@64k", help="one of bench/bench_nsa.py's shape names")
    ap.add_argument("--op", default="nsa_core", help="an op of bench/ops.py's registry")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the profiled one")
    ap.add_argument("--csv", type=Path, default=Path("ncu_raw.csv"), help="where ncu's raw CSV goes")
    ap.add_argument("--table", type=Path, help="only print the table of this earlier CSV")
    ap.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)  # the run ncu profiles
    args = ap.parse_args()
    if args.workload:
        workload(args.shapes, args.op, args.warmup)
        return
    if args.table is None:
        run_ncu(args.shapes, args.op, args.warmup, args.csv)
    table(args.table or args.csv)


if __name__ == "__main__":
    main()
