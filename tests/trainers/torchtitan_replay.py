"""torchtitan's own output, recorded on a GPU, played back as a run: torchtitan needs CUDA (on a
CPU build of torch it stops at ``torch.cuda.set_device``), so the CPU tests judge what a real run
wrote (validation/tests/evidence/torchtitan_<case>/, bench/gpu/torchtitan_evidence.sh).

It takes torchtitan's arguments (the ones it does not read are ignored) and
``--evidence CASE``. Into ``--dump_folder`` it copies the case's dump folder (TensorBoard events,
structured logs, comm_traces), with times moved to now; then it prints the recorded stdout and
stderr a line at a time (a metrics line every ``--line-s``), and ends as the recorded run ended:
its exit code, killed by SIGKILL (``exit_code`` says ``KILL``) or stopped for good (``STOP``:
it prints nothing more and waits, as the stopped rank did, until the harness ends it).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--evidence", required=True)
    ap.add_argument("--job.dump_folder", "--dump_folder", dest="dump_folder", required=True)  # 0.2.x, 0.3.x
    ap.add_argument("--line-s", type=float, default=0.05)
    args, _ = ap.parse_known_args()
    case = EVIDENCE / f"torchtitan_{args.evidence}"
    dump = Path(args.dump_folder)
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
