"""Where a steady run's slow steps come from: trains the model a few times at one shape and, per run,
names each step slower than SLOW x the median with how much longer each of its stages took
(heartbeat gaps against their medians) and the garbage collections that ran during it.

For a point that fails its toks_per_s_cv gate on a few slow steps: it tells a stall of the whole
host (every host stage of a step slower at once: another thread holding the GIL, a collection,
the machine) from one stage's work. Beside each run, a probe in this process (not the trainer's)
sleeps a millisecond at a time and keeps its late wake-ups: a slow step during which the probe
stalled too is the machine's, not the trainer's. ``--gc off`` runs the trainer with Python's
garbage collector disabled, so a slow step left then is no collection's.

    python3 bench/step_jitter.py --seq-len 4096 --kind dense --steps 40 --runs 2 --dataset text synthetic
    python3 bench/step_jitter.py --seq-len 4096 --kind dense --dataset text --gc default off
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: a step is slow when it takes this many times the run's median step
SLOW = 1.2

#: a probe's wake-up this much later than its 1 ms sleep is a stall of the machine
PROBE_STALL_S = 0.004

#: runs the trainer with every garbage collection's start, end and generation appended to
#: gc_events.jsonl in its out dir (gc.callbacks; the trainer itself is unchanged); argv[2] "off"
#: disables the collector first
_GC_LOGGING_MAIN = """
import gc, json, runpy, sys, time
out = open(sys.argv[1], "a", buffering=1)
if sys.argv.pop(2) == "off":
    gc.disable()
started = {}
def log(phase, info):
    now = time.time()
    if phase == "start":
        started["t"] = now
    else:
        out.write(json.dumps({"start": started.get("t", now), "end": now, "gen": info["generation"],
                              "collected": info["collected"]}) + "\\n")
gc.callbacks.append(log)
sys.argv = ["nsa.train"] + sys.argv[2:]
runpy.run_module("nsa.train", run_name="__main__", alter_sys=True)
"""


class HostProbe:
    """Sleeps 1 ms at a time in a thread of this process while the trainer runs in its own, and
    keeps each (went to sleep, woke) whose wake-up came PROBE_STALL_S or more late."""

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            slept = time.time()
            time.sleep(0.001)
            if time.time() - slept > 0.001 + PROBE_STALL_S:
                self.stalls.append((slept, time.time()))

    def __enter__(self) -> "HostProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def train(out_dir: Path, args: argparse.Namespace, dataset: str, gc_mode: str) -> None:
    overrides = (f"data.dataset={dataset} dist.mode=single train.batch_size=1 train.grad_accum=1 "
                 f"train.fused_adamw=true train.save_final=false train.seq_len={args.seq_len} "
                 f"model.attn.kind={args.kind}")
    out_dir.mkdir(parents=True)
    cmd = [sys.executable, "-c", _GC_LOGGING_MAIN, str(out_dir / "gc_events.jsonl"), gc_mode, "--config", args.config,
           "--override", overrides, "--steps", str(args.steps), "--out-dir", str(out_dir)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def stage_spans(out_dir: Path) -> dict[int, dict[str, float]]:
    """Step -> stage -> seconds from the previous heartbeat to this stage's."""
    beats = [json.loads(line) for line in (out_dir / "heartbeat_rank0.jsonl").read_text().splitlines() if line]
    spans: dict[int, dict[str, float]] = {}
    for prev, cur in zip(beats, beats[1:]):
        spans.setdefault(cur["step"], {})[cur["stage"]] = cur["time"] - prev["time"]
    return spans


def step_windows(out_dir: Path) -> dict[int, tuple[float, float]]:
    """Step -> (first heartbeat time, last heartbeat time)."""
    out: dict[int, tuple[float, float]] = {}
    for line in (out_dir / "heartbeat_rank0.jsonl").read_text().splitlines():
        b = json.loads(line)
        lo, hi = out.get(b["step"], (b["time"], b["time"]))
        out[b["step"]] = (min(lo, b["time"]), max(hi, b["time"]))
    return out


def report(out_dir: Path, label: str, warmup: int, stalls: list[tuple[float, float]]) -> None:
    rows = list(csv.DictReader((out_dir / "training.csv").open()))
    times = {int(r["step"]): float(r["step_time_s"]) for r in rows}
    steady = {s: t for s, t in times.items() if s > warmup}
    med = statistics.median(steady.values())
    cv = statistics.stdev(steady.values()) / statistics.mean(steady.values())
    spans, windows = stage_spans(out_dir), step_windows(out_dir)
    stage_med = {st: statistics.median(spans[s][st] for s in steady if st in spans.get(s, {}))
                 for st in {st for s in steady for st in spans.get(s, {})}}
    gcs = [json.loads(line) for line in (out_dir / "gc_events.jsonl").read_text().splitlines() if line]
    slow = [s for s, t in steady.items() if t > SLOW * med]
    print(f"{label}: median step {med * 1e3:.2f} ms, cv {cv:.3f} over steps {warmup + 1}..{max(times)}; "
          f"{len(slow)} slow (> {SLOW}x); {len(gcs)} collections in the run, "
          f"{sum(g['gen'] == 2 for g in gcs)} of generation 2; the probe beside it stalled {len(stalls)} times "
          f"(longest {max((b - a for a, b in stalls), default=0) * 1e3:.1f} ms)", flush=True)
    for s in slow:
        extra = ", ".join(f"{st} {(spans[s][st] - stage_med[st]) * 1e3:+.1f}" for st in sorted(spans.get(s, {}))
                          if st in stage_med)
        lo, hi = windows.get(s - 1, windows[s])[1], windows[s][1]
        during = [g for g in gcs if g["end"] >= lo and g["start"] <= hi]
        gc_text = ", ".join(f"gen {g['gen']} {(g['end'] - g['start']) * 1e3:.1f} ms" for g in during) or "none"
        probe = ", ".join(f"{(b - a) * 1e3:.1f} ms" for a, b in stalls if b >= lo and a <= hi) or "none"
        print(f"  step {s}: {times[s] * 1e3:.2f} ms ({times[s] / med:.2f}x); stages ms over their median: {extra}; "
              f"collections during it: {gc_text}; the probe's stalls: {probe}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="m7c_125m")
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--kind", default="dense", choices=["nsa", "dense"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the statistics (CUDA-graph capture)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--dataset", nargs="+", default=["text", "synthetic"])
    ap.add_argument("--gc", nargs="+", default=["default"], choices=["default", "off"],
                    help="the trainer's garbage collector: as it comes, or disabled for the whole run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for gc_mode in args.gc:
            for dataset in args.dataset:
                for i in range(args.runs):
                    out = Path(tmp) / f"{gc_mode}_{dataset}{i}"
                    with HostProbe() as probe:
                        train(out, args, dataset, gc_mode)
                    report(out, f"{args.kind} S={args.seq_len} {dataset} gc {gc_mode} run {i + 1}", args.warmup,
                           probe.stalls)


if __name__ == "__main__":
    main()
