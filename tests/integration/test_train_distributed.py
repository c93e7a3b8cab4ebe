"""Real torchrun launches on CPU (gloo, 2 processes) of the tiny model.

Equivalence tolerance: DDP and FSDP2 losses and grad norms must equal the one-process values
(same global batch: 4 rows x 2 micro-batches) to rel 1e-5. Everything runs in float32; the only
difference is the order of the cross-rank gradient sums (and FSDP's reduce-scatter). Measured
on this CPU: max rel diff 8.5e-8 (loss) and 4.0e-7 (grad norm) over 4 steps, so 1e-5 leaves
~25x headroom. A real bug (wrong sharding, double-counted or unsynced micro-batches, loss not
averaged) moves the loss in the 2nd-3rd significant digit.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa.train.cli import run

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
COMMON = (f"model.n_layers=2 train.seq_len=64 train.grad_accum=2 train.activation_checkpointing=true "
          f"train.print_every=100 train.save_final=false train.steps={STEPS}")


def launch(args: list[str], env_extra: dict[str, str], nproc: int | None = 2, timeout: int = 240):
    """Run python (or torchrun with nproc) from the repo root with a clean NSA_* environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_") and k != "CONFIG"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **env_extra)
    prefix = [sys.executable]
    if nproc:
        prefix += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.run(prefix + args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def steps(out: Path, rank: int = 0) -> dict[int, dict]:
    recs = [json.loads(x) for x in (out / f"heartbeat_rank{rank}.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in recs if r["stage"] == "step"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("single")
    assert run("tiny", [f"{COMMON} train.batch_size=4 train.out_dir={out}"], env={}) == 0
    return steps(out)


def assert_same_curve(got: dict[int, dict], ref: dict[int, dict]) -> None:
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    for s in ref:
        assert got[s]["loss"] == pytest.approx(ref[s]["loss"], rel=1e-5), s
        assert got[s]["grad_norm"] == pytest.approx(ref[s]["grad_norm"], rel=1e-5), s
        assert got[s]["lr"] == ref[s]["lr"]


@pytest.mark.distributed
@pytest.mark.slow
def test_ddp_with_checkpointing_and_accumulation_matches_one_process(tmp_path: Path, reference):
    """The seeds' "mark a variable ready only once" case: DDP + activation checkpointing +
    gradient accumulation, launched with the runbook's own command line and toggles; with the
    contract's profile request too, which rank 0 answers without moving the loss curve."""
    p = launch(["scripts/train_showcase.py", "--dataset", "pattern", "--ddp", "1", "--steps", str(STEPS),
                "--out-dir", str(tmp_path), "--override", f"{COMMON} train.batch_size=2"],
               {"CONFIG": "tiny", "NSA_DDP_STATIC_GRAPH": "1", "NSA_DDP_BUCKET_MB": "1", "NSA_PREFILL_BATCHED": "1",
                "CONTRACT_PROFILE_STEPS": "2"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "[ddp] bucket_cap_mb=1 static_graph=True" in p.stdout
    assert_same_curve(steps(tmp_path), reference)
    assert_same_curve(steps(tmp_path, rank=1), reference)
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["world_size"] == 2 and env["dist"] == {"mode": "ddp", "backend": "gloo"}
    assert env["env"]["CONFIG"] == "tiny" and env["env_toggles"]["NSA_DDP_BUCKET_MB"]["key"] == "dist.ddp_bucket_mb"
    assert "NSA_PREFILL_BATCHED" in env["noop_toggles"]
    row = (tmp_path / "training.csv").read_text().splitlines()[-1].split(",")
    assert float(row[3]) == pytest.approx(2 * 64 * 2 * 2 / float(row[4]), rel=1e-3)  # global tokens/s
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert (profile["profiled_steps"], profile["first_step"]) == (2, 2) and env["profile"]["note"] == "steps 2..3"


@pytest.mark.distributed
@pytest.mark.slow
def test_fsdp2_interrupted_and_resumed_matches_one_process(tmp_path: Path, reference):
    """FSDP2 stops after 2 steps (sharded checkpoint gathered to one file), resumes with
    train.resume=auto and must still reproduce the one-process curve."""
    for extra in ("train.run_steps=2", "train.resume=auto"):
        p = launch(["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path),
                    "--override", f"{COMMON} train.batch_size=2 dist.mode=fsdp {extra}"], {})
        assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed from" in p.stdout
    assert_same_curve(steps(tmp_path), reference)
    assert_same_curve(steps(tmp_path, rank=1), reference)
    assert json.loads((tmp_path / "env.json").read_text())["dist"]["mode"] == "fsdp"


@pytest.mark.distributed
@pytest.mark.slow
def test_sigterm_to_torchrun_stops_every_rank_after_the_same_step_and_resumes_the_curve(tmp_path: Path, reference):
    """A preemption as Slurm and Kubernetes deliver it: SIGTERM to torchrun, which passes it on to
    its workers. Both ranks stop after the step in flight (step 2, held by a stall), save it and
    end by SIGTERM; train.resume=auto continues the one-process curve. The ranks were killed at
    once, and the run resumed from its last checkpoint (here none: from step 1)."""
    import signal
    args = ["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path),
            "--override", f"{COMMON} train.batch_size=2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_") and k != "CONFIG"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", NSA_FAULT="stall:step=2:seconds=3")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, csv = time.monotonic(), tmp_path / "training.csv"
    while not (csv.exists() and "\n1," in csv.read_text()):
        assert proc.poll() is None and time.monotonic() - t0 < 180, "the run ended or stalled before step 1"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert "Signal 15 (SIGTERM) received" in err or "exitcode  : -15" in err or "got signal: 15" in err, err[-3000:]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_0000002.pt", err[-3000:]
    for rank in (0, 1):
        assert f"[rank {rank}] SIGTERM: stopping after this step" in err, err[-3000:]
        assert max(steps(tmp_path, rank)) == 2
    assert json.loads((tmp_path / "env.json").read_text())["status"] == "stopped by SIGTERM after step 2"
    p = launch(args + ["train.resume=auto"], {})
    assert p.returncode == 0, p.stderr[-3000:]
    assert_same_curve(steps(tmp_path), reference)
    assert_same_curve(steps(tmp_path, rank=1), reference)


@pytest.mark.distributed
@pytest.mark.slow
def test_ctrl_c_to_one_rank_stops_every_rank_for_the_same_reason(tmp_path: Path):
    """SIGINT to rank 1's process alone: both ranks stop after the same step, both as interrupted.
    Rank 0, which saw only that some rank asked to stop, said 'stopped by operator .HALT' in
    env.json (rank 0 writes it) and exited 0 beside rank 1's 130."""
    import signal
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_") and k != "CONFIG"}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", NSA_FAULT="stall:step=2:seconds=3")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path),
                             "--override", f"{COMMON} train.batch_size=2"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, beats = time.monotonic(), tmp_path / "heartbeat_rank1.jsonl"
    while not (beats.exists() and '"stage": "step"' in beats.read_text()):  # step 1 logged by rank 1
        assert proc.poll() is None and time.monotonic() - t0 < 180, "the run ended or stalled before step 1"
        time.sleep(0.1)
    os.kill(json.loads(beats.read_text().splitlines()[0])["pid"], signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert json.loads((tmp_path / "env.json").read_text())["status"] == "interrupted (Ctrl-C) after step 2", err[-3000:]
    assert "[rank 0] Ctrl-C" not in err and "[rank 1] Ctrl-C: stopping after this step" in err, err[-3000:]
    assert max(steps(tmp_path, 0)) == max(steps(tmp_path, 1)) == 2


@pytest.mark.distributed
@pytest.mark.slow
def test_a_stalled_rank_ends_the_run_with_every_ranks_stacks(tmp_path: Path):
    timeout_s, grace_s = 10, 5  # 10 s: set-up on a loaded 2-core CI must not trip it
    t0 = time.monotonic()
    p = launch(["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path), "--steps", "50",
                "--override", f"model.n_layers=1 watchdog.timeout_s={timeout_s} watchdog.poll_s=0.5 "
                              f"watchdog.grace_s={grace_s}"],
               {"NSA_FAULT": "stall:rank=1:step=3"}, timeout=120)
    wall = time.monotonic() - t0
    assert p.returncode != 0
    assert "exitcode  : 3" in p.stderr  # EXIT_WATCHDOG, reported by torchrun
    halt = json.loads((tmp_path / ".HALT").read_text())
    assert halt["source"] == "watchdog" and halt["step"] == 3
    dumps = {r: (tmp_path / f"stackdump_rank{r}.txt").read_text() for r in (0, 1)}
    for r, text in dumps.items():
        assert f"=== watchdog rank {r}" in text and "most recent call first" in text and "train_step" in text
    assert "faults.py" in dumps[1]  # rank 1 is caught where it stalls
    # ended within the watchdog limit: from the stall (rank 1's last heartbeat) to exit
    hb1 = [json.loads(x) for x in (tmp_path / "heartbeat_rank1.jsonl").read_text().splitlines()]
    assert hb1[-1]["step"] == 3 and hb1[-1]["stage"] == "forward"
    stalled_for = time.time() - hb1[-1]["time"]
    assert stalled_for < timeout_s + grace_s + 10, (stalled_for, wall)
    # no orphans: every trainer process is gone
    pids = {json.loads(x)["pid"] for r in (0, 1) for x in (tmp_path / f"heartbeat_rank{r}.jsonl").read_text().splitlines()}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.distributed
@pytest.mark.parametrize("nproc, peer", [(2, r"rank 1"), (3, r"(rank 2|ranks 1, 2) \(process gone\)")],
                         ids=["two", "three"])
def test_a_peer_killed_by_sigkill_is_named_as_lost_in_env_json(tmp_path: Path, nproc: int, peer: str):
    """The last rank SIGKILLed (kill -9, a node gone) at step 3: rank 0's env.json status was gloo's
    raw text ("error at step 3: RuntimeError('[/__w/pytorch/.../pair.cc:537] Read error
    [127.0.0.1]:6051: Connection reset by peer. ...')"), naming neither the rank nor what happened in
    words. Now it says which rank was lost (of two, the other; of more, those whose processes are
    gone), with gloo's text kept as the detail, and rank 0 says so on stderr. Of three, rank 1 fails
    on the same broken collective and ends too: on a loaded machine it may have ended before rank 0
    looked (rank 0 looks first thing, before it logs), and then both are named; never rank 0."""
    p = launch(["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path), "--steps", "6",
                "--override", "model.n_layers=1 train.print_every=100"],
               {"NSA_FAULT": f"kill:rank={nproc - 1}:step=3"}, nproc=nproc, timeout=180)
    assert p.returncode != 0
    said = (rf"lost {peer} at step 3: a connection of rank 0's collective broke \(a peer's process ended, or its "
            r"host went away\)")
    rank0 = [line for line in p.stderr.splitlines() if line.startswith(("[rank 0]", "[rank0]"))]
    assert any(re.fullmatch(rf"\[rank 0\] {said}", line) for line in rank0), "\n".join(rank0[:40])
    status = json.loads((tmp_path / "env.json").read_text())["status"]
    assert re.match(rf"{said}; detail: RuntimeError: ", status) and "by peer" in status, status


def test_a_watchdog_exit_is_the_status_in_env_json(tmp_path: Path):
    """`NSA_FAULT=stall:step=2 python -m nsa.train --config tiny ...` ended with exit 3, .HALT and a
    stack dump, and env.json's status still said 'running': the watchdog's thread ends the run with
    os._exit, and only the main thread, stuck in the stall, ever wrote env.json."""
    p = launch(["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path), "--steps", "5",
                "--override", "model.n_layers=1 watchdog.timeout_s=5 watchdog.startup_s=60 "
                              "watchdog.poll_s=0.2 watchdog.grace_s=0.5"],
               {"NSA_FAULT": "stall:step=2"}, nproc=None, timeout=120)  # startup_s: a loaded box's set-up
    assert p.returncode == 3, p.stderr[-3000:]
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["status"].startswith("watchdog: no progress for ") and "at step 2 stage forward; exit 3" in env["status"]
    assert env["config"]["model"]["n_layers"] == 1  # the rest of env.json is the main thread's, kept


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("startup_s, fires", [(60, False), (1, True)], ids=["allowance", "none"])
def test_a_slow_first_step_is_not_a_stall(tmp_path: Path, startup_s: int, fires: bool):
    """Rank 0's first step takes 6 s (as a compile or autotune does) against a 2 s
    watchdog.timeout_s: with watchdog.startup_s the run completes; with none (startup_s below
    timeout_s) the watchdog fires by step 1, as it did before the allowance existed (in step 1, or in
    set-up already where a loaded box takes longer than 2 s to build the model)."""
    p = launch(["-m", "nsa.train", "--config", "tiny", "--out-dir", str(tmp_path), "--steps", "3",
                "--override", f"model.n_layers=1 watchdog.timeout_s=2 watchdog.startup_s={startup_s} "
                              "watchdog.poll_s=0.25 watchdog.grace_s=2"],
               {"NSA_FAULT": "stall:rank=0:step=1:seconds=6"}, timeout=120)
    if fires:
        assert "exitcode  : 3" in p.stderr, p.stderr[-3000:]
        halt = json.loads((tmp_path / ".HALT").read_text())
        assert halt["step"] <= 1 and "watchdog.timeout_s=2" in halt["reason"], halt
    else:
        assert p.returncode == 0, p.stderr[-3000:]
        assert not (tmp_path / ".HALT").exists()
        assert max(steps(tmp_path)) == 3


def test_showcase_single_process_with_the_runbook_flags(tmp_path: Path):
    p = launch(["scripts/train_showcase.py", "--dataset", "synthetic", "--ddp", "0", "--steps", "2",
                "--loader-timeout", "30", "--out-dir", str(tmp_path), "--override", "model.n_layers=1"],
               {"CONFIG": "tiny", "NSA_TB_DISABLE": "1", "NSA_DISABLE_AUX_STATS": "1"}, nproc=None)
    assert p.returncode == 0, p.stderr[-3000:]
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["config"]["data"]["dataset"] == "synthetic" and env["config"]["data"]["loader_timeout_s"] == 30
    assert env["config"]["telemetry"]["disable_aux_stats"] is True
    assert env["noop_toggles"]["NSA_TB_DISABLE"]
    assert "gates" not in steps(tmp_path)[2]  # aux stats really off
