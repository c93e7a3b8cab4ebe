"""The rank faults of test_rank_faults.py (and test_departed_rank.py's rank that exits 0 early)
again, with the trainer on two CUDA GPUs: ``train.device=cuda``, DDP over NCCL, the real trainer
under ``torchrun --standalone --nproc_per_node=2`` through the real harness. Runs only with two or
more CUDA GPUs (marker ``multi_gpu``; the root conftest skips it, with the reason, before any
fixture is set up, so CPU CI pays nothing): ``bash bench/gpu/nccl_faults.sh`` on a GPU box. The last
three tests run two nodes (two torchrun agents on the box, a GPU each) over NCCL.

What differs from gloo, and what each test therefore asserts (the required outcome is the same):

- A rank that stops leaves the other blocked on the GPU, not in a socket: NCCL kernels spin on a
  peer that never comes and the host waits in a CUDA sync (the step's ``.tolist()`` of the stats
  exchange, or ``torch.tensor(..., device=cuda)``), with the GIL released. No 'Connection closed by
  peer': the survivor is ended by the trainer's watchdog (``os._exit``), torchrun's SIGTERM (its
  default action: the trainer keeps SIGTERM's default) or the harness's stall watch. The survivor's
  last heartbeat is therefore often a later stage of the step (optimizer, where the host first
  waits) than on gloo (backward): the tests assert its step, not its stage.
- torch's own NCCL watchdog (``dist.timeout_s``, default 1800 s) does not end these runs: on two
  H200s (torch 2.11, NCCL 2.28, 2026-11-27) a stall with ``dist.timeout_s=15`` and the trainer's
  watchdog off was still running 60 s later, when the harness's stall watch ended it. The trainer's
  watchdog or the harness's stall watch is what ends a stalled run.
- A rank that leaves (exception, exit 0) tears its process group down; on NCCL
  ``destroy_process_group`` finalizes the communicator, which may wait for the peer that is itself
  waiting in a collective for it. The tests require the faulted rank to be named all the same.

Each test records a row of the reliability matrix's "NCCL, two GPUs" section (tests/faults/conftest.py).
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.faults import _util as U
from tests.faults.test_departed_rank import FAULT as QUIT_FAULT
from tests.faults.test_departed_rank import QUIT_STEP, STEPS, _run, _titles
from validation.judge.findings import find
from validation.judge.record import Status
from validation.launch.stacks import pyspy_executable

pytestmark = [pytest.mark.faults, pytest.mark.distributed, pytest.mark.multi_gpu,
              pytest.mark.usefixtures("nccl_warm")]

SECTION = "NCCL, two GPUs"
#: CUDA context and NCCL communicator set-up on each rank: the first step's allowance
STARTUP_S = 90.0
#: the harness's hard limit of one faulted phase (the tiny preset's steps take milliseconds on an H100)
TIMEOUT_S = 150.0
#: from the fault to the end of the run, as on gloo: watchdog limit + 30 s
BOUND_S = U.NCCL_WATCHDOG_S + 30.0


@pytest.fixture(scope="module")
def nccl_warm(tmp_path_factory) -> None:
    """A healthy run of the same phase first, GO through the harness, with the faulted runs'
    watchdog.timeout_s: its first step compiles the Triton kernels of the tiny model on the GPUs
    (tens of seconds, no beat meanwhile), under the trainer's watchdog.startup_s. On the first
    runs of the module on an H200 pair (2026-11-27), before the trainer had a start-up allowance,
    the compile outlasted the 10 s watchdog and every run was a watchdog stall. The faulted runs
    after it load the kernels from the cache."""
    root = tmp_path_factory.mktemp("nccl_warm")
    phase = U.nccl_phase("warm", "", startup_s=300, timeout_s=400)
    rb = U.write_runbook(root / "warm.yaml", [phase])
    p = U.harness("run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(root / "results"),
                  "--no-plots", timeout=480)
    assert p.rc == 0, f"a healthy DDP run over NCCL is not GO (exit {p.rc}):\n{p.stderr[-3000:]}"


def _run_nccl(seeded, name: str, fault: str, **extra) -> tuple[U.Proc, object]:
    rb = seeded.runbook(U.nccl_phase(name, fault, startup_s=STARTUP_S, timeout_s=TIMEOUT_S, **extra))
    p = seeded.run(rb, name, timeout=TIMEOUT_S + 90)
    return p, U.record(seeded.results, name)


def _assert_nccl(seeded, rec, mode: str = "ddp") -> None:
    """The run really was DDP (or ``mode``) over NCCL on two GPUs (not a silent fall-back to gloo or
    one device)."""
    env = U.load_env(seeded.results / rec.out_dir)
    assert env["dist"] == {"mode": mode, "backend": "nccl"}, env["dist"]
    assert env["world_size"] == 2 and env["rank0_device"].startswith("cuda"), (env["world_size"], env["rank0_device"])


@pytest.mark.parametrize("mode", list(U.DIST_MODES))
def test_stalled_rank_is_halted_by_the_watchdog(seeded, matrix, mode):
    name, fault = U.DIST_MODES[mode]
    matrix.start(fault, f"`NSA_FAULT=stall:rank=1:step=3`, torchrun x2, {name} over NCCL on 2 GPUs",
                 "watchdog fires on every rank (rank 0 waiting in a CUDA sync): stack dumps, .HALT, exit 3; FAIL "
                 "naming rank 1 stuck at step 3", section=SECTION)
    p, rec = _run_nccl(seeded, "stall", "stall:rank=1:step=3", overrides={"dist.mode": mode})
    _assert_nccl(seeded, rec, mode)
    assert rec.status == "FAIL" and "watchdog" in rec.reason, rec.reason
    assert not rec.timed_out, "the harness timeout fired: the watchdog did not end the run"
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= BOUND_S, f"stall took {took:.1f}s from the fault to the end > {BOUND_S}s"
    ev = rec.evidence
    # rank 0 waits with the GIL released (CUDA sync): its Python watchdog thread dumps as on gloo
    assert set(ev.stackdumps) == {0, 1}, f"every rank must leave a stack dump: {sorted(ev.stackdumps)}"
    assert ev.halt
    f = U.finding(seeded.results, "stall", "stall in stall")
    text = U.finding_text(f)
    assert "hung: rank 1 in at" in f.title, text  # the stalled rank, never rank 0 that waited for it
    assert "rank 1: last heartbeat step 3, stage forward" in text and "faults.py" in text, text
    assert "rank 0: last heartbeat step 3" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)


def test_stalled_rank_without_watchdog_is_stopped_by_the_harness_stall_watch(seeded, matrix):
    """The trainer's watchdog is off: the harness's stall watch takes both ranks' stacks (py-spy
    reads a process blocked in a CUDA sync as well as one in a socket) and kills the tree, within
    stall_s + 10 s of the fault. NCCL's own timeout (1800 s) is far away."""
    stall_s = 20.0
    bound = stall_s + 10
    matrix.start("stalled rank, watchdog off", "`NSA_FAULT=stall:rank=1:step=3`, `watchdog.enabled=false`, "
                 f"`stall_s` {stall_s:g} s, torchrun x2, DDP over NCCL on 2 GPUs",
                 "the harness's stall watch: py-spy stacks of both ranks (rank 0 in a CUDA sync), the whole tree "
                 "killed; FAIL 'stalled' naming rank 1 in the injected stall", section=SECTION)
    p, rec = _run_nccl(seeded, "hang", "stall:rank=1:step=3", stall_s=stall_s,
                       overrides={"watchdog.enabled": False})
    _assert_nccl(seeded, rec)
    assert rec.status == "FAIL" and "stalled" in rec.reason, rec.reason
    assert not rec.timed_out and rec.stalled_s >= stall_s
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= bound, f"the stall was reported {took:.1f}s after the fault > {bound:g}s"
    taken = {(t.rank, t.method) for t in rec.evidence.taken_stacks}
    method = "py-spy" if pyspy_executable() else "SIGUSR1"
    assert taken == {(0, method), (1, method)}, (taken, [t.note for t in rec.evidence.taken_stacks])
    f = U.finding(seeded.results, "hang", "stall in hang")
    text = U.finding_text(f)
    # py-spy names the frame by its function ('at'), or by its qualified name on some versions
    assert "stopped by the harness" in f.title and re.search(r"rank 1 in (FaultInjector\.)?at\b", f.title), text
    assert "rank 1: last heartbeat step 3, stage forward; stack (harness_stacks/rank1.txt" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, bound)


def test_sigkilled_rank_ends_the_run(seeded, matrix):
    matrix.start("SIGKILLed rank", "`NSA_FAULT=kill:rank=1:step=3` (SIGKILL to itself), torchrun x2, DDP over "
                 "NCCL on 2 GPUs", "torchrun SIGTERMs rank 0 (blocked in NCCL, no peer error); FAIL naming "
                 "rank 1, its signal and its last step", section=SECTION)
    p, rec = _run_nccl(seeded, "kill", "kill:rank=1:step=3")
    _assert_nccl(seeded, rec)
    assert rec.status == "FAIL" and "crashed" in rec.reason, rec.reason
    assert not rec.timed_out
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= BOUND_S, f"kill took {took:.1f}s from the fault to the end > {BOUND_S}s"
    f = U.finding(seeded.results, "kill", "crash in kill")
    text = U.finding_text(f)
    assert "rank 1" in f.title and "SIGKILL" in f.title, text
    assert "rank 1: last heartbeat step 3" in text, text
    assert "rank 0: last heartbeat step 3" in text, text  # it reached step 3 and waited there
    assert "trainer.stderr.log" in text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)


def test_frozen_rank_is_named_though_it_leaves_no_stack(seeded, matrix):
    """Rank 1 SIGSTOPs itself: no stack of its own, py-spy cannot read it, torchrun's SIGTERM cannot
    end it; rank 0 waits in NCCL until its watchdog fires (tests/faults/test_rank_faults.py has the
    gloo case)."""
    matrix.start("frozen rank", "`NSA_FAULT=freeze:rank=1:step=3` (SIGSTOP to itself), torchrun x2, DDP over "
                 "NCCL on 2 GPUs", "the harness's stall watch ends the run; FAIL naming rank 1 hung (no stack) "
                 "and rank 0 waiting", section=SECTION)
    p, rec = _run_nccl(seeded, "freeze", "freeze:rank=1:step=3", stall_s=20)
    _assert_nccl(seeded, rec)
    assert rec.status == "FAIL" and rec.stalled_s is not None, rec.reason
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= BOUND_S, f"freeze took {took:.1f}s from the fault to the end > {BOUND_S}s"
    f = U.finding(seeded.results, "freeze", "stall in freeze")
    text = U.finding_text(f)
    assert ("hung: rank 1 (no stack; its process stopped, by SIGSTOP or a debugger; last heartbeat step 3, stage "
            "forward); waiting for it: rank 0 in ") in f.title, text
    assert "exited 0" not in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)


def test_exception_on_one_rank(seeded, matrix):
    matrix.start("exception on one rank", "`NSA_FAULT=crash:rank=1:step=2:stage=backward`, torchrun x2, DDP "
                 "over NCCL on 2 GPUs", "FAIL with the exception, rank 1, step 2, stderr log (rank 0, blocked "
                 "in NCCL, ended by torchrun)", section=SECTION)
    p, rec = _run_nccl(seeded, "crash", "crash:rank=1:step=2:stage=backward")
    _assert_nccl(seeded, rec)
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 2, "backward")
    titles = [f.title for f in U.findings_of(seeded.results, "crash")]
    assert rec.status == "FAIL" and "crashed" in rec.reason, (rec.reason, titles)
    assert took <= BOUND_S, f"{took:.1f}s from the fault to the end"
    f = U.finding(seeded.results, "crash", "crash in crash")
    text = U.finding_text(f)
    assert "rank 1" in f.title, text
    assert "InjectedFault: injected crash on rank 1 at step 2 stage backward" in f.title, text
    assert "rank 1: last heartbeat step 2, stage backward" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)


def test_nan_loss_halts_with_the_rank_and_step(seeded, matrix):
    matrix.start("NaN loss", "`NSA_FAULT=nan:rank=0:step=3`, torchrun x2, DDP over NCCL on 2 GPUs",
                 "both ranks see the gathered loss, halt before the optimizer step, exit 4; FAIL 'non-finite loss "
                 "at step 3' naming rank 0; not a stall", section=SECTION)
    p, rec = _run_nccl(seeded, "nan", "nan:rank=0:step=3")
    _assert_nccl(seeded, rec)
    took, f = U.assert_nan_halt_named(seeded, rec, p, BOUND_S)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)


def test_the_rank_that_exited_0_is_named(tmp_path, matrix, monkeypatch):
    """test_departed_rank.py's rank 1 that exits 0 as step 3 starts (native_train.py), its
    all-reduce over NCCL on the GPUs: rank 0 waits in a CUDA sync for a peer that is gone (gloo
    would fail it with 'Connection closed by peer'), torchrun waits for rank 0, and the stall watch
    ends the run. Rank 1 is the cause and must be the one named; rank 0 only waited."""
    matrix.start("rank exits 0 early", f"`TEST_TRAINER_FAULT={QUIT_FAULT}` (native_train.py, "
                 "`TEST_TRAINER_BACKEND=nccl`), torchrun x2 on 2 GPUs",
                 "FAIL (stalled, or crashed once rank 0 fails); the finding names rank 1 as having exited 0 early "
                 "(last heartbeat step 2), never rank 0 that waited for it", section=SECTION)
    monkeypatch.setenv("TEST_TRAINER_BACKEND", "nccl")
    t0 = time.time()
    rec = _run(tmp_path, "native", {"kind": "torchrun", "nproc": 2}, monkeypatch)
    text = _titles(rec)
    assert rec.status == Status.FAIL and not rec.timed_out, (rec.reason, text)
    [f] = [f for f in find([rec]) if f.title.startswith(("stall in", "early exit in"))]
    assert f.kind == "departed", text
    assert "rank 1 exited 0 early" in f.title, text
    assert f"rank 1: last heartbeat step {QUIT_STEP - 1}, stage step" in text, text
    assert "ChildFailedError" not in f.title and "hung: rank 0" not in f.title, text
    U.assert_no_orphans(str(tmp_path))
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)
    assert rec.metrics.steps_completed < STEPS


# ------------------------------------------------------------------ two nodes over NCCL
#: two torchrun agents on this host, one GPU each (the harness gives each node its own:
#: validation/launch/nodes.py node_devices), meeting at a c10d rendezvous: a two-node run over NCCL
TWO_NODES = {"kind": "torchrun", "nproc": 1, "nnodes": 2, "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 30}}


def _node_of(rec, rank: int) -> int:
    [node] = [n.index for n in rec.evidence.nodes.nodes if rank in n.ranks]
    return node


def test_two_nodes_over_nccl_are_go_each_on_a_gpu_of_its_own(seeded, matrix):
    matrix.start("two nodes, healthy", "two torchrun agents x1 (c10d on localhost), DDP over NCCL, one GPU each",
                 "GO; each node's agent given a GPU of its own (CUDA_VISIBLE_DEVICES), both ranks on cuda:0 of "
                 "their node", section=SECTION)
    t0 = time.time()
    p, rec = _run_nccl(seeded, "two_nodes", "", launcher=TWO_NODES)
    env = U.load_env(seeded.results / rec.out_dir)
    assert rec.status == "PASS", (rec.reason, [f.title for f in U.findings_of(seeded.results, "two_nodes")])
    assert env["dist"] == {"mode": "ddp", "backend": "nccl"} and env["world_size"] == 2, env["dist"]
    devices = [n.devices for n in rec.evidence.nodes.nodes]
    assert len(set(devices)) == 2 and None not in devices, devices
    info = U.finding_text(U.finding(seeded.results, "two_nodes", "2 nodes in two_nodes"))
    assert all(f"GPUs {d}" in info for d in devices), info
    run_dir = seeded.results / rec.out_dir
    for rank in (0, 1):  # NVML's readings of each rank's GPU, for the log (the idle-rank rule reads them)
        beats = [json.loads(x) for x in (run_dir / f"heartbeat_rank{rank}.jsonl").read_text().splitlines()]
        print(f"rank {rank} gpu_util:", [b.get("gpu_util") for b in beats if "gpu_util" in b])
    report = Path(p.stdout.rsplit("-> ", 1)[-1].strip())
    assert p.rc == 0, report.read_text()[:6000] if report.is_file() else p.stdout
    matrix.done(rec.status, rec.reason + " | " + info.splitlines()[0], time.time() - t0, None)


def test_a_node_whose_rank_stalls_over_nccl_is_named(seeded, matrix):
    """Rank 1 stalls; its node's agent and the other node's rank 0 (in a CUDA sync, waiting for
    it) stay up; the trainer's watchdog is off, so the harness's stall watch takes both ranks'
    stacks, each headed with its node, and names the hung node."""
    stall_s = 20.0
    matrix.start("two nodes, a rank stalls", "`NSA_FAULT=stall:rank=1:step=3`, `watchdog.enabled=false`, "
                 f"`stall_s` {stall_s:g} s, two agents x1 over NCCL, one GPU each",
                 "FAIL 'stalled'; the node of rank 1 named hung, rank 1 in the injected stall, the other node's "
                 "rank 0 waiting for it", section=SECTION)
    p, rec = _run_nccl(seeded, "node_hang", "stall:rank=1:step=3", stall_s=stall_s, launcher=TWO_NODES,
                       overrides={"watchdog.enabled": False})
    assert rec.status == "FAIL" and "stalled" in rec.reason, rec.reason
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= stall_s + 10, f"the stall was reported {took:.1f}s after the fault"
    hung, other = _node_of(rec, 1), _node_of(rec, 0)
    f = U.finding(seeded.results, "node_hang", f"node {hung} hung in node_hang")
    text = U.finding_text(f)
    assert re.search(rf"node {hung}'s rank 1 in (FaultInjector\.)?at\b", text), text
    assert f"waiting for it: node {other}'s rank 0" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, stall_s + 10)


def test_a_node_whose_rank_is_killed_over_nccl_is_named(seeded, matrix):
    matrix.start("two nodes, a rank SIGKILLed", "`NSA_FAULT=kill:rank=1:step=3`, two agents x1 over NCCL, one GPU "
                 "each", "FAIL; the node of rank 1 named, its rank killed by SIGKILL, how the other node ended",
                 section=SECTION)
    p, rec = _run_nccl(seeded, "node_kill", "kill:rank=1:step=3", launcher=TWO_NODES)
    # a crash, also where rank 0's own watchdog ended it (a dead peer breaks no NCCL collective)
    assert rec.status == "FAIL" and "crashed" in rec.reason and not rec.timed_out, rec.reason
    took = U.fault_to_end_s(seeded.results / rec.out_dir, 1, 3, "forward")
    assert took <= BOUND_S, f"kill took {took:.1f}s from the fault to the end > {BOUND_S}s"
    killed, other = _node_of(rec, 1), _node_of(rec, 0)
    f = U.finding(seeded.results, "node_kill", f"node {killed}'s rank 1 was killed by SIGKILL in node_kill")
    text = U.finding_text(f)
    assert f"the other nodes: node {other}: rank 0" in text, text
    U.assert_no_go_after(seeded, rec, p)
    matrix.done(rec.status, rec.reason + " | " + f.title, took, BOUND_S)
