"""torchtitan's own output, recorded on a GPU, played back as a run: torchtitan needs CUDA (on a
CPU build of torch it stops at ``torch.cuda.set_device``), so the CPU tests judge what a real run
wrote (validation/tests/evidence/torchtitan_<case>/, bench/gpu/torchtitan_evidence.sh).

It takes torchtitan's arguments (the ones it does not read are ignored) and
``--evidence CASE``. Into ``--dump_folder`` it copies the case's dump folder (TensorBoard events,
structured logs, comm_traces), with times moved to now; then it prints the recorded stdout and
stderr a line at a time (a metrics line every ``--line-s``), and ends as the recorded run ended:
its exit code, killed by SIGKILL (``exit_code`` says ``KILL``) or stopped for good (``STOP``:
it prints nothing more and waits, as the stopped rank did, until the harness ends it).

``--attempts SPEC`` plays the case as the attempts of a run restarted by torchrun's
``--max-restarts``, one a call: the attempt is ``TORCHELASTIC_RESTART_COUNT`` (which torchrun sets),
SPEC its ``FROM:END`` entries, comma-separated. Each prints the case's lines before its first step,
``Training starts at step FROM`` there (after torchtitan's checkpoint-loading lines where FROM > 1),
then the steps from FROM, its times moved on by the recording's span per earlier attempt, and ends:
``nan@N`` before step N as torchtitan 0.3.x does on a non-finite loss (its RuntimeError's traceback
on stderr with torch.distributed's ``[rank0]:`` prefix, exit 1), the loss of its last three steps
climbing; ``kill@N`` killed by SIGKILL before step N; nothing, as the case ended. The dump folder
is left empty: the recorded TensorBoard events are of the run that was never restarted.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import re
import time
import traceback
from datetime import datetime, timedelta
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parents[2] / "validation" / "tests" / "evidence"


def _shift_structured(folder: Path, by_s: float) -> None:
    """Move the structured logs' times by ``by_s`` seconds (the harness reads heartbeat times)."""
    for path in folder.glob("structured_logs/*.jsonl"):
        out = []
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            for key, scale in (("time", 1), ("time_ms", 1000), ("time_us", 1_000_000)):
                if key in rec:
                    rec[key] = int(rec[key] + by_s * scale)
            out.append(json.dumps(rec))
        path.write_text("\n".join(out) + "\n")


_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}")
_STEP = re.compile(r"step:\s*(\d+)\s")
_LOSS = re.compile(r"loss:\s*([\d.]+)")
_STAMP_FORMAT = "%Y-%m-%d %H:%M:%S,%f"


def _when(line: str) -> datetime | None:
    m = _STAMP.search(line)
    return datetime.strptime(m[0], _STAMP_FORMAT) if m else None


def _moved(line: str, by: timedelta) -> str:
    when = _when(line)
    return _STAMP.sub((when + by).strftime(_STAMP_FORMAT)[:-3], line, count=1) if when else line


def _step(line: str) -> int | None:
    m = _STEP.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
    return int(m[1]) if m and "loss:" in line else None


def _nonfinite(step: int) -> None:
    """torchtitan 0.3.x's RuntimeError, raised in train_step, as a worker under torchrun prints it."""
    try:
        raise RuntimeError(f"Loss is not finite (global_avg_loss=nan) at step {step}. Stopping training.")
    except RuntimeError:
        text = traceback.format_exc()
    rank = os.environ.get("RANK", "0")
    sys.stderr.write("".join(f"[rank{rank}]: {line}\n" for line in text.splitlines()))
    sys.stderr.flush()


def _attempt(case: Path, spec: str, dump: Path, line_s: float) -> int:
    """One attempt of a restarted run (module docstring)."""
    entries = spec.split(",")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    begin, _, end = entries[min(attempt, len(entries) - 1)].partition(":")
    first = int(begin)
    how, _, at = end.partition("@")
    stop = int(at) if at else None
    lines = (case / "stdout.log").read_text(errors="replace").splitlines()
    steps = [i for i, line in enumerate(lines) if _step(line) is not None]
    times = [t for t in map(_when, lines) if t is not None]
    by = (times[-1] - times[0] + timedelta(seconds=1)) * attempt
    dump.mkdir(parents=True, exist_ok=True)
    for line in lines[:steps[0]]:
        if "Training starts at step" in line and first > 1:
            for said in (f"Loading the checkpoint from {dump}/checkpoint/step-{first - 1}.",
                         "Finished loading the checkpoint in 0.21 seconds."):
                print(_moved(line.split(" - INFO - ")[0] + " - INFO - " + said, by), flush=True)
            line = line.replace("Training starts at step 1", f"Training starts at step {first}")
        print(_moved(line, by), flush=True)
    printing = False
    for line in lines[steps[0]:]:
        step = _step(line)
        if step is not None:
            if stop is not None and step >= stop:
                break
            printing = step >= first
            if printing and how == "nan" and stop - step <= 3:  # climbing to the non-finite loss
                m = _LOSS.search(line)
                line = _LOSS.sub(f"loss: {float(m[1]) * (5 - (stop - step)):8.5f}", line, count=1)
        if printing:
            print(_moved(line, by), flush=True)
            if step is not None:
                time.sleep(line_s)
    if how == "nan":
        _nonfinite(stop)
        return 1
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return int((case / "exit_code").read_text().strip())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evidence", required=True)
    ap.add_argument("--job.dump_folder", "--dump_folder", dest="dump_folder", required=True)  # 0.2.x, 0.3.x
    ap.add_argument("--line-s", type=float, default=0.05)
    ap.add_argument("--attempts")
    args, _ = ap.parse_known_args()
    case = EVIDENCE / f"torchtitan_{args.evidence}"
    dump = Path(args.dump_folder)
    if args.attempts:
        return _attempt(case, args.attempts, dump, args.line_s)
    if (case / "torchtitan").is_dir():
        shutil.copytree(case / "torchtitan", dump, dirs_exist_ok=True)
    started = [json.loads(line)["time"] for p in dump.glob("structured_logs/*.jsonl")
               for line in p.read_text().splitlines()[:1]]
    if started:
        _shift_structured(dump, time.time() - min(started))
    for line in (case / "stdout.log").read_text(errors="replace").splitlines():
        print(line, flush=True)
        if "step:" in line:
            time.sleep(args.line_s)
    err = case / "stderr.log"
    if err.is_file():
        sys.stderr.write(err.read_text(errors="replace"))
        sys.stderr.flush()
    end = (case / "exit_code").read_text().strip()
    if end == "KILL":
        os.kill(os.getpid(), signal.SIGKILL)
    if end == "STOP":
        while True:
            time.sleep(3600)
    return int(end)


if __name__ == "__main__":
    sys.exit(main())
