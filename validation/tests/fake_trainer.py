"""A stand-in trainer that writes the trainer's output contract (nsa/contract.py, docs/artifact_contract.md)
quickly and without torch, with faults injected through ``NSA_FAULT``. It tests the harness's
logic, not the model: runbooks in these tests point ``launcher.module`` here.

    NSA_FAULT=                   healthy run (toks/s ~200, memory flat)
    NSA_FAULT=crash:step=3       raises RuntimeError at step 3 (non-zero exit, traceback in stderr)
    NSA_FAULT=stall:rank=1:step=3  rank 1 stops in backward; watchdog: stack dumps, .HALT, exit 3
    NSA_FAULT=hang               never finishes; dumps stacks on SIGUSR1; leaves a child process
    NSA_FAULT=missing_csv        writes everything but training.csv
    NSA_FAULT=corrupt_csv        writes a training.csv with a bad header or a non-number
                                 (with :crash=K it then raises RuntimeError at step K)
    NSA_FAULT=cliff              toks/s collapses when train.batch_size >= 2 (the seeds' 165 -> 6)
    NSA_FAULT=idle:rank=1        rank 1 never steps and reports 0% GPU utilisation
                                 (with :silent=1 its heartbeat file is created and never written)
    NSA_FAULT=slow:rank=1        rank 1 takes 3x as long per step
    NSA_FAULT=fallback           reports fallback counters and a fallback route
    NSA_FAULT=quit:step=4        exits 0 after logging step 4, without a .HALT (a run that stopped short)
    NSA_FAULT=quit_rank:rank=1:step=2  every rank records each step's end (stage step); rank 1's
                                 heartbeats stop within step 3 (it left, exit 0) while the others
                                 and training.csv go on to the last step, exit 0
                                 (with :plain=1 every record holds only time, rank and step: no
                                 stage, so none records a step's end, as the contract allows; with
                                 :every=E every rank writes a heartbeat only every E steps, the
                                 last step not forced; rank=R of no rank: every rank finishes)
    NSA_FAULT=lean               writes only what the contract requires: no attention_backends or
                                 git_sha in env.json, no values in the optional training.csv columns
    NSA_FAULT=nan_unlogged:step=3  the loss guard fires at step 3 before the row is logged: a
                                 nonfinite .HALT and exit code 4, every logged loss finite
    NSA_FAULT=nan_logged:step=3  logs a NaN loss from step 3 on and exits 0 (no loss guard);
                                 with :inf=1 an inf loss; with :once=1 at step 3 only (the run goes on)
    NSA_FAULT=halt:step=4        an operator's stop: as step 4 begins it writes a plain-text .HALT and
                                 exits 0 (steps 1-3 logged); without step=K after its last step; with
                                 :json=1 a JSON record of its own source ("operator") and step
    NSA_FAULT=resume_skip:steps=2  a resumed run's loss continues 2 steps too far along its curve
                                 (data skipped), and env.json says where its data started
                                 (with :unrecorded=1 its env.json says the data continued)
    NSA_FAULT=resume_optim       a resumed run's loss matches at its first step and drifts from the
                                 next on (its optimizer state not restored)
    NSA_FAULT=crash_stopping:step=2  a run asked to stop early (train.run_steps) crashes at step 2
    NSA_FAULT=ignore_stop        a run asked to stop early (train.run_steps) runs every step all the same,
                                 then saves its checkpoint (of its last step)
    NSA_FAULT=ignore_resume      a run asked to resume (train.resume) trains from step 1 instead, in a
                                 process of its own (its heartbeats' times follow the earlier run's);
                                 with :nodata=1 its env.json records no data_position
    NSA_FAULT=torn_last          runs every step, but its last row lacks its line end and its last
                                 columns (cut off mid-write), and exits 0
    NSA_FAULT=rerun:step=K:back=J  resumes in place once: after logging step K its "restarted process"
                                 (heartbeats of another pid) writes steps J+1.. again into the same files;
                                 the first occurrence of those steps logs 1 token/s and a loss 1.0 higher
    NSA_FAULT=leak:mb=M          memory (CSV and heartbeats) grows by M MiB a step from 1 GiB
    NSA_FAULT=spike:step=K       logs twice the loss at step K (one step; the loss goes on as before)
    NSA_FAULT=shift:step=K       logs three times the loss from step K on (a level shift: it stays there)
    NSA_FAULT=count_twice        its step counter moves by two a step: the CSV and the heartbeats
                                 (a stage record a step) name steps 2, 4, ... and the run ends at
                                 the last, having run half the steps it counts
    NSA_FAULT=lone_hang:rank=1:step=3  rank 1 writes step 3's forward record and no heartbeat after it
                                 while the other ranks step on, not waiting for it (ranks that do not
                                 synchronise every step); a rank with a process of its own (torchrun)
                                 sleeps there (in ``hung_alone``) until it is killed
NSA_FAKE_LOG_EVERY=N writes a training.csv row only every N steps (the last step not forced) while every rank's
heartbeats record each step's end, as a trainer that logs every N steps does;
NSA_FAKE_BEAT_EVERY=N: every rank writes a heartbeat only at the steps that are a multiple of N and at the
run's last step, each a record of the step done (stage step), as a trainer that beats every N steps does;
NSA_FAKE_WORLD=N simulates N ranks from one process; without it, under torchrun (RANK set), each process is
its own rank and writes its own heartbeats, rank 0 the run's env.json and training.csv; NSA_FAKE_STEP_S=S sleeps
S seconds a step;
NSA_FAKE_TOKS_SCALE=F multiplies tokens/s by F (a staged throughput change); FAKE_TRAINER_TOKS_SCALE_OF=P:F,...
multiplies it by F in the points of phase P only (set in the harness's environment, which passes no NSA_*
variable on, not the runbook's: a change of the trainer between two stores, as a baseline comparison sees it); NSA_FAKE_TOKS_BY_REPEAT=a,b,c
multiplies it by a in a repeated point's first repeat, b in its second, ... (its directory's name,
``repeatK``, says which): run-to-run noise, made to order; NSA_FAKE_LOSS_BY_REPEAT=a,b,... multiplies the
loss of step s by a**s in the first repeat, ...: runs of one seed that drift apart (not deterministic);
NSA_FAKE_GIT_SHA=C writes commit C into env.json (a point re-run after a commit);
NSA_FAKE_FAULT_REPEATS=a,b,... injects NSA_FAULT only in a repeated point's repeats a, b, ... (1-based);
NSA_FAKE_FAULT_DIRS=d,... injects it only in the runs whose output directory is named d, ... (a resume
point's 'reference', 'first' or 'second'); NSA_FAKE_RESUME_COPIES=1: a resumed run first copies the
training.csv and heartbeat files of the run it resumes from into its own directory, then appends its steps.

Like the real trainer it stops after ``train.run_steps`` steps (writing checkpoints/latest) and
resumes from the run directory ``train.resume`` names, logging the steps after its checkpoint's;
its loss is a function of the step, so a resumed run continues the uninterrupted one exactly.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"


def parse_fault(spec: str) -> tuple[str, dict[str, int]]:
    if not spec:
        return "", {}
    name, *kv = spec.split(":")
    return name, {k: int(v) for k, v in (x.split("=") for x in kv)}


def allreduce_wait(seconds: float) -> None:
    """Where the stalled rank 'hangs' (a name the stall finding should report)."""
    time.sleep(seconds)


def hung_alone() -> None:
    """Where a rank of ``lone_hang`` sleeps while the others step on (a name the stall finding should report)."""
    while True:
        time.sleep(1)


def backward_stuck(out: Path, rank: int) -> None:
    with open(out / f"stackdump_rank{rank}.txt", "w") as fh:
        faulthandler.dump_traceback(fh, all_threads=True)


def operator_halt(out: Path, step: int, opts: dict[str, int]) -> None:
    """The .HALT of an operator's stop at ``step``: plain text, or with ``json`` a record of its own source."""
    said = "stopped by the operator"
    (out / ".HALT").write_text(json.dumps({"source": "operator", "step": step, "text": said}) if opts.get("json")
                               else said + "\n")


def phase_scale(out: Path) -> float:
    """FAKE_TRAINER_TOKS_SCALE_OF's factor of this run's phase (results/runs/RB/PROFILE/PHASE/POINT/RUN)."""
    scales = dict(item.split(":") for item in os.environ.get("FAKE_TRAINER_TOKS_SCALE_OF", "").split(",") if item)
    parts = out.parts
    runs = len(parts) - 1 - parts[::-1].index("runs") if "runs" in parts else None
    phase = parts[runs + 3] if runs is not None and len(parts) > runs + 3 else ""
    return float(scales.get(phase, 1.0))


def repeat_scale(out: Path, variable: str = "NSA_FAKE_TOKS_BY_REPEAT") -> float:
    """This repeat's factor from ``variable`` (a,b,c: a in repeat1, ...); 1 outside repeats."""
    scales = os.environ.get(variable)
    if not scales or not out.name.startswith("repeat"):
        return 1.0
    return float(scales.split(",")[int(out.name[len("repeat"):]) - 1])


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--override", default="")
    p.add_argument("--out-dir", required=True, type=Path)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    out: Path = a.out_dir
    out.mkdir(parents=True, exist_ok=True)
    fault, opts = parse_fault(os.environ.get("NSA_FAULT", ""))
    only = os.environ.get("NSA_FAKE_FAULT_REPEATS")
    if only and not (out.name.startswith("repeat") and out.name[len("repeat"):] in only.split(",")):
        fault, opts = "", {}
    dirs = os.environ.get("NSA_FAKE_FAULT_DIRS")
    if dirs and out.name not in dirs.split(","):
        fault, opts = "", {}
    world = int(os.environ.get("NSA_FAKE_WORLD", os.environ.get("WORLD_SIZE", "1")))
    # under torchrun each process writes the heartbeats of its own rank; rank 0 the run's files
    ranks = [int(os.environ["RANK"])] if "RANK" in os.environ and "NSA_FAKE_WORLD" not in os.environ else range(world)
    lead = 0 in ranks
    overrides = dict(x.split("=", 1) for x in a.override.split())
    batch = int(overrides.get("train.batch_size", 1))
    env = {k: v for k, v in os.environ.items() if k.startswith(("NSA_", "NCCL_")) or k == "CONFIG"}
    backends = {"cmp": {"backend": "torch", "reason": "portable PyTorch path", "calls": a.steps},
                "win": {"backend": "torch", "reason": "portable PyTorch path", "calls": a.steps}}
    if fault == "fallback":
        backends["sel"] = {"backend": "torch", "reason": "fallback: triton unavailable", "calls": a.steps}
    stopping = int(overrides.get("train.run_steps", 0))
    stop = stopping if stopping and fault != "ignore_stop" else a.steps
    start = 0
    resume = Path(overrides["train.resume"]) if overrides.get("train.resume") else None
    if resume is not None and fault != "ignore_resume":
        start = int((resume / "checkpoints" / "latest").read_text())
    skip = opts.get("steps", 0) if fault == "resume_skip" and start else 0
    env_json = {"world_size": world, "env": env, "attention_backends": backends,
                "git_sha": os.environ.get("NSA_FAKE_GIT_SHA", "0" * 40),
                "config": {"name": a.config, "overrides": overrides},
                "data_position": {"start": start + skip * (not opts.get("unrecorded")),
                                  "end": stop + skip * (not opts.get("unrecorded"))}, "device_mem_gb": 80.0}
    if fault == "ignore_resume" and opts.get("nodata"):
        del env_json["data_position"]
    if fault == "lean":
        env_json = {"world_size": world}
    if lead:
        (out / "env.json").write_text(json.dumps(env_json))
    if fault == "hang":
        faulthandler.register(signal.SIGUSR1, file=open(out / "stackdump_rank0.txt", "w"), all_threads=True)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        (out / "child.pid").write_text(str(child.pid))
        allreduce_wait(600)
    step_s = float(os.environ.get("NSA_FAKE_STEP_S", "0"))
    copies = resume is not None and os.environ.get("NSA_FAKE_RESUME_COPIES") == "1"
    if copies:
        for name in (["training.csv"] if lead else []) + [f"heartbeat_rank{r}.jsonl" for r in ranks]:
            if (resume / name).exists():
                (out / name).write_bytes((resume / name).read_bytes())
    csv = None if fault == "missing_csv" or not lead else open(out / "training.csv", "a" if copies else "w",
                                                              buffering=1)
    if csv and not copies:
        csv.write(("step,loss,toks\n" if fault == "corrupt_csv" and opts.get("header") else HEADER + "\n"))
    # line-buffered, as the harness watches them while the run goes
    beats = {r: open(out / f"heartbeat_rank{r}.jsonl", "a" if copies else "w", buffering=1) for r in ranks}
    # a process started after the run it should have resumed: its clock reads later than that run's
    t0 = 1_000_000.0 + (1_000.0 if fault == "ignore_resume" and resume is not None else 0.0)
    log_every = int(os.environ.get("NSA_FAKE_LOG_EVERY", "1"))
    beat_every = int(os.environ.get("NSA_FAKE_BEAT_EVERY", "1"))
    order = list(range(start + 1, stop + 1))
    if fault == "rerun":
        order = list(range(start + 1, opts["step"] + 1)) + list(range(opts["back"] + 1, stop + 1))
    if fault == "count_twice":
        order = list(range(start + 2, stop + 1, 2))
    for i, step in enumerate(order):
        tick = start + i + 1  # the clock goes on across a rerun
        superseded = fault == "rerun" and i < opts["step"] - start and step > opts["back"]
        mem = 1.0 + step * opts.get("mb", 0) / 1024
        if ((fault == "crash" or fault == "crash_stopping" and stop < a.steps) and step == opts.get("step", 1)
                or fault == "corrupt_csv" and step == opts.get("crash")):
            csv and csv.flush()
            raise RuntimeError("Expected to mark a variable ready only once (injected crash)")
        if fault == "quit" and step > opts.get("step", 1):
            return 0
        if fault == "halt" and step == opts.get("step"):
            operator_halt(out, step, opts)
            return 0
        if fault == "nan_unlogged" and step == opts.get("step", 1):
            (out / ".HALT").write_text(json.dumps({"source": "nonfinite", "step": step}))
            return 4
        toks = ((200.0 + (step % 3)) * float(os.environ.get("NSA_FAKE_TOKS_SCALE", "1")) * repeat_scale(out)
                * phase_scale(out))
        if fault == "cliff" and batch >= 2:
            toks = 6.0 + (step % 2)
        if superseded:
            toks = 1.0
        for r, fh in beats.items():
            slow = 3.0 if fault == "slow" and r == opts.get("rank") else 1.0
            if fault == "quit_rank" and step % opts.get("every", 1):
                continue
            if fault == "quit_rank" and opts.get("plain"):
                if r != opts.get("rank") or step <= opts.get("step", 1) + 1:  # it begins step K+1, then leaves
                    fh.write(json.dumps({"time": t0 + tick * 0.5, "rank": r, "step": step}) + "\n")
                continue
            if fault == "quit_rank" and r == opts.get("rank") and step > opts.get("step", 1):
                if step == opts.get("step", 1) + 1:
                    fh.write(json.dumps({"time": t0 + tick * 0.5, "rank": r, "step": step, "stage": "forward"}) + "\n")
                continue
            if beat_every > 1:
                if not step % beat_every or step == stop:
                    fh.write(json.dumps({"time": t0 + tick * 0.5, "rank": r, "step": step, "stage": "step"}) + "\n")
                continue
            if fault == "lone_hang" and r == opts.get("rank") and step >= opts.get("step", 1):
                if step == opts.get("step", 1):
                    fh.write(json.dumps({"time": t0 + tick * 0.5, "rank": r, "step": step, "stage": "forward"}) + "\n")
                    if len(beats) == 1:  # its own process: it hangs there, and the others step on without it
                        hung_alone()
                continue
            if fault == "idle" and r == opts.get("rank"):
                if step == 1 and not opts.get("silent"):
                    fh.write(json.dumps({"time": t0, "rank": r, "step": 0, "stage": "data", "gpu_util": 0}) + "\n")
                continue
            rec = {"time": t0 + tick * 0.5 * slow, "rank": r, "step": step, "stage": "optimizer",
                   "toks_per_s": toks, "mem": 1.0, "gpu_util": 99, "gates": {"cmp": 0.5, "sel": 0.5, "win": 0.5}}
            if fault == "rerun":
                rec["pid"] = os.getpid() + (i >= opts["step"] - start)
            if fault == "leak":
                rec["mem_alloc_gb"] = mem
            if fault == "fallback":
                rec["fallbacks"] = {"sel_triton_fail": step}
            if fault == "stall" and r == opts.get("rank") and step >= opts.get("step", 1):
                rec.update(stage="backward", step=step)
            fh.write(json.dumps(rec) + "\n")
            if fault == "quit_rank" or log_every > 1:
                fh.write(json.dumps({**rec, "stage": "step", "time": rec["time"] + 0.1}) + "\n")
        if fault == "stall" and step >= opts.get("step", 1):
            for fh in beats.values():
                fh.flush()
            backward_stuck(out, opts.get("rank", 0))
            for r in range(world):
                if r != opts.get("rank", 0):
                    (out / f"stackdump_rank{r}.txt").write_text(
                        'Current thread 0x00007f0000000001 (most recent call first):\n'
                        '  File "/x/torch/distributed/distributed_c10d.py", line 2501 in all_reduce\n'
                        '  File "/x/nsa/train/loop.py", line 88 in train_step\n'
                        '  File "/x/nsa/train/__main__.py", line 20 in <module>\n')
            (out / ".HALT").write_text(json.dumps({"source": "watchdog", "step": step, "stage": "backward"}))
            print(f"[watchdog] no rank progressed; stack dumps written; halting at step {step}", file=sys.stderr)
            return 3
        if csv and not step % log_every:
            if fault == "corrupt_csv" and not opts.get("header") and step == 2:
                csv.write(f"{step},2.0,1e-4,fast,0.1,1.0,0.5,1.0\n")
            elif fault == "lean":
                csv.write(f"{step},{3.0 - step * 0.01:.4f},1e-4,{toks},nan,nan,nan,nan\n")
            elif fault == "torn_last" and step == stop:
                csv.write(f"{step},{3.0 - step * 0.01:.4f},1e-4,{toks},0.5,1.")
            elif fault == "nan_logged" and (step == opts.get("step", 1) if opts.get("once")
                                            else step >= opts.get("step", 1)):
                csv.write(f"{step},{'inf' if opts.get('inf') else 'nan'},1e-4,{toks},0.5,nan,0.5,1.0\n")
            else:
                loss = 3.0 - (step + skip) * 0.01 + (1.0 if superseded else 0.0)
                if fault == "resume_optim" and start:
                    loss += 0.05 * (step - start - 1)
                loss *= repeat_scale(out, "NSA_FAKE_LOSS_BY_REPEAT") ** step
                if fault == "spike" and step == opts.get("step"):
                    loss *= 2
                if fault == "shift" and step >= opts.get("step", 1):
                    loss *= 3
                csv.write(f"{step},{loss:.4f},1e-4,{toks},{0.5},{1.0},{mem / 2},{mem}\n")
        time.sleep(step_s)
    if fault == "halt" and "step" not in opts:
        operator_halt(out, stop, opts)
    if stopping:
        (out / "checkpoints").mkdir(exist_ok=True)
        (out / "checkpoints" / "latest").write_text(str(stop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
