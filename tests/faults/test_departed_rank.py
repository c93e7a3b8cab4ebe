"""A rank that exits 0 early: its own stop condition ends it before the steps asked for, with
no traceback, while the other ranks still need it. The others then fail in their collectives
after it (gloo: 'Connection closed by peer', which is no failure of their own) or wait for it
until the stall watch stops the run. The rank that left is the cause and must be the one named;
the harness once headed such a crash with torchrun's ChildFailedError and the victim's
'Connection closed by peer', and such a stall as 'node 1 hung ... waiting for it: node 0's rank 0'
with advice to install py-spy, naming no rank that left.

Test trainers outside the nsa package (tests/trainers/), ``TEST_TRAINER_FAULT=quit_rank:1@3``:
native_train.py all-reduces over gloo (the others' collective fails), minimal_train.py has no
collectives (the others wait in wait_for_peers, as NCCL would without a timeout).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.faults import _util as U
from validation.judge.findings import find, recommendations
from validation.judge.diagnosis import diagnose
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord, Status
from validation.launch.process import LAUNCH_OVER_GRACE_S

pytestmark = [pytest.mark.faults, pytest.mark.distributed]

STEPS, QUIT_STEP, STALL_S = 8, 3, 4.0
#: the two-node point's stall allowance: long, so that a record at the stall would show
NODES_STALL_S = 60.0
FAULT = f"quit_rank:1@{QUIT_STEP}"
#: rank 1 leaves inside the last step, after its first record of it (that step's number, in progress)
LAST_STEP_FAULT = f"quit_in_step:1@{STEPS}"
TRAINERS = {
    "native": {"name": "native", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"]},
    "minimal": {"name": "minimal", "root": "tests/trainers", "script": "minimal_train.py",
                "steps": {"env": "MINIMAL_STEPS"}, "out_dir": {"env": "MINIMAL_OUT_DIR"}, "env": {"MINIMAL_LOG_EVERY": 1}},
    # the seed system's format, read through its adapter: every rank beats as each step starts, and
    # only rank 0 writes a record after a step (its logged ones)
    "seedlike": {"name": "seedlike", "root": "tests/trainers", "script": "seedlike_train.py",
                 "args": ["--dataset", "synthetic"],
                 "config": {"template": "configs/seedlike.yaml", "pass_as": {"env": "CONFIG"}},
                 "steps": {"flag": "--steps"}, "out_dir": {"config": "train.out_dir"},
                 "env": {"NSA_HEARTBEAT_EVERY": 1}, "format": "seed"},
}


def _run(tmp_path: Path, trainer: str, launcher: dict[str, Any], monkeypatch, stall_s: float = STALL_S,
         fault: str = FAULT) -> PhaseRecord:
    monkeypatch.setenv("TEST_TRAINER_FAULT", fault)
    phase = {"name": "quit_rank", "kind": "train", "steps": STEPS, "timeout_s": 120, "stall_s": stall_s,
             "startup_s": 60, "launcher": launcher, "env": {"OMP_NUM_THREADS": 1},
             "gates": [{"metric": "loss_finite", "op": "==", "threshold": 1}]}
    return U.run_one_point(tmp_path, f"departed_{trainer}", TRAINERS[trainer], phase)


def _titles(rec: PhaseRecord) -> str:
    return "\n".join(f"{f.kind}: {f.title}\n  " + "\n  ".join(f.detail) for f in find([rec]))


@pytest.mark.parametrize("rank", [1, 0])
def test_the_rank_that_exited_0_is_named_not_the_one_whose_collective_broke(tmp_path, matrix, monkeypatch, rank):
    """rank 0: the rank that left is the lowest, and the one whose files (training.csv) stop first;
    the rank left failing in its collective is rank 1."""
    other, fault = 1 - rank, f"quit_rank:{rank}@{QUIT_STEP}"
    matrix.start("rank exits 0 early" + (", rank 0" if rank == 0 else ""),
                 f"`TEST_TRAINER_FAULT={fault}` (native_train.py), torchrun x2 (gloo)",
                 f"FAIL; the crash finding names rank {rank} as having exited 0 early (as step 3 started: its last "
                 f"heartbeat step 2), not rank {other}'s broken collective; advice about a rank's own stop condition, "
                 "not a traceback")
    t0 = time.time()
    rec = _run(tmp_path, "native", {"kind": "torchrun", "nproc": 2}, monkeypatch, fault=fault)
    assert rec.status == Status.FAIL and "crashed" in rec.reason, rec.reason
    text = _titles(rec)
    [f] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert f.kind == "departed", text
    assert f"rank {rank} exited 0 early (last heartbeat step {QUIT_STEP - 1} of {STEPS}" in f.title, text
    assert f"rank {other}" not in f.title, text
    assert "ChildFailedError" not in f.title and "Connection closed" not in f.title, text
    assert f"rank {rank}: last heartbeat step 2, stage step; exited 0" in text, text
    assert [(r.rank, r.step) for r in f.diagnosis.ranks] == [(rank, QUIT_STEP - 1)], f.diagnosis
    assert verdict_line(rec).startswith(f"rank {rank} exited 0 early (last heartbeat step 2"), verdict_line(rec)
    [advice] = recommendations(find([rec]))
    assert "exited 0 before the steps asked for" in advice and "traceback" not in advice, advice
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)


def test_a_stall_after_a_rank_exited_0_names_that_rank(tmp_path, matrix, monkeypatch):
    matrix.start("rank exits 0 early, the others wait", f"`TEST_TRAINER_FAULT={FAULT}` (minimal_train.py: no "
                 "collectives, the others wait as NCCL would), torchrun x2",
                 "FAIL 'stalled'; the stall finding names rank 1 as having exited 0 early and rank 0 where it waits")
    t0 = time.time()
    rec = _run(tmp_path, "minimal", {"kind": "torchrun", "nproc": 2}, monkeypatch)
    assert rec.status == Status.FAIL and rec.reason.startswith("stalled"), rec.reason
    text = _titles(rec)
    [f] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert f.kind == "departed", text
    assert "rank 1 exited 0 early" in f.title and "rank 0 in wait_for_peers" in f.title, text
    assert "rank 1: last heartbeat step 2, stage step; no process left to take a stack of: it had ended (exited 0)" \
        in f.detail, text
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)


def test_a_node_whose_rank_exited_0_is_named_not_a_hung_node(tmp_path, matrix, monkeypatch):
    """Node 1's agent, its worker done, waits at torchrun's exit barrier on the store it may hold:
    it ends when that store goes with node 0's agent (exit 0), or would wait out the stall watch
    (a race; the point once waited the whole stall_s). Once node 0's agent has failed and no rank
    runs under either agent, the harness stops the launch within LAUNCH_OVER_GRACE_S: a crash of
    node 0's exit code, whichever agent held the store, and no node 'hung'."""
    matrix.start("rank exits 0 early on one of two nodes",
                 f"`TEST_TRAINER_FAULT={FAULT}` (native_train.py), two torchrun agents x1 (c10d on localhost), "
                 f"`stall_s` {NODES_STALL_S:g} s",
                 "FAIL 'crashed (exit code 1)' within the grace after node 0's agent failed, not at stall_s (node 1's "
                 "agent, left at torchrun's exit barrier with no rank under it, stopped); node 1's rank 1 named as "
                 "having exited 0 early, node 0's rank 0 as failed after it; no 'hung' node, no py-spy advice")
    rec = _run(tmp_path, "native", {"kind": "torchrun", "nproc": 1, "nnodes": 2,
                                    "rdzv": {"endpoint": "localhost:0", "join_timeout_s": 20}}, monkeypatch,
               stall_s=NODES_STALL_S)
    assert rec.status == Status.FAIL and rec.reason == "trainer crashed (exit code 1)", rec.reason
    [node0] = [n for n in rec.evidence.nodes.nodes if 0 in n.ranks]
    after = rec.wall_s - node0.ended_s  # from node 0's agent's failure to the record
    bound = LAUNCH_OVER_GRACE_S + 5.0
    assert after <= bound and rec.wall_s < NODES_STALL_S, (after, rec.wall_s, rec.evidence.nodes)
    text = _titles(rec)
    assert "hung" not in text, text
    [node] = [f for f in find([rec]) if f.title.startswith("node ")]
    assert node.kind == "departed" and node.title.startswith("node 1's rank 1 exited 0 early"), text
    assert "node 0: rank 0 last heartbeat step 3, stage forward, RuntimeError: " in node.title, text
    assert "node 1: no other rank, agent " in node.title and "end not known" not in node.title, text
    [first] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert first.kind == "departed" and "rank 1 exited 0 early" in first.title, text
    assert not any("py-spy" in a for a in recommendations(find([rec]))), recommendations(find([rec]))
    # the log the record shows (the report's stderr tail and exception) is node 1's, not rank 0's that failed after it
    leaver = rec.evidence.nodes.of_rank(1).log
    assert rec.evidence.stderr_log == leaver and f"stderr: {rec.out_dir}/{leaver}" in first.detail, rec.evidence
    assert "[rank0]:" not in rec.evidence.stderr_tail and "Connection" not in (rec.evidence.exception or ""), \
        rec.evidence
    matrix.done(rec.status, rec.reason + " | " + node.title, after, bound)


def test_a_rank_that_exited_0_inside_the_last_step_is_named(tmp_path, matrix, monkeypatch):
    """Rank 1's last heartbeat is the last step's own 'forward' record (the step in progress, not
    completed): it left before finishing the steps asked for. Its step number equals the steps
    asked for, and the harness once passed it over: the crash was headed by torchrun's
    ChildFailedError and rank 0's 'Connection closed by peer', naming no cause."""
    matrix.start("rank exits 0 inside the last step", f"`TEST_TRAINER_FAULT={LAST_STEP_FAULT}` (native_train.py: "
                 f"exit 0 after step {STEPS}'s forward record), torchrun x2 (gloo)",
                 f"FAIL; the crash finding names rank 1 as having exited 0 early (last heartbeat step {STEPS} of "
                 f"{STEPS}, stage forward: step {STEPS} not completed), not rank 0's broken collective")
    t0 = time.time()
    rec = _run(tmp_path, "native", {"kind": "torchrun", "nproc": 2}, monkeypatch, fault=LAST_STEP_FAULT)
    assert rec.status == Status.FAIL and "crashed" in rec.reason, rec.reason
    text = _titles(rec)
    [f] = [f for f in find([rec]) if f.title.startswith("early exit in")]
    assert f.kind == "departed", text
    assert (f"rank 1 exited 0 early (last heartbeat step {STEPS} of {STEPS}, stage forward: step {STEPS} not "
            "completed); the other ranks failed without it") in f.title, text
    assert "ChildFailedError" not in f.title and "Connection closed" not in f.title, text
    [advice] = recommendations(find([rec]))
    assert "exited 0 before the steps asked for" in advice, advice
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)


def test_a_stall_after_a_rank_exited_0_inside_the_last_step_names_that_rank(tmp_path, matrix, monkeypatch):
    matrix.start("rank exits 0 inside the last step, the others wait",
                 f"`TEST_TRAINER_FAULT={LAST_STEP_FAULT}` (minimal_train.py: a data record of step {STEPS}, then "
                 "exit 0; the others wait as NCCL would), torchrun x2",
                 "FAIL 'stalled'; the stall finding names rank 1 as having exited 0 early inside the last step and "
                 "rank 0 where it waits")
    t0 = time.time()
    rec = _run(tmp_path, "minimal", {"kind": "torchrun", "nproc": 2}, monkeypatch, fault=LAST_STEP_FAULT)
    assert rec.status == Status.FAIL and rec.reason.startswith("stalled"), rec.reason
    text = _titles(rec)
    [f] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert f.kind == "departed", text
    assert (f"rank 1 exited 0 early (last heartbeat step {STEPS} of {STEPS}, stage data: step {STEPS} not "
            "completed)") in f.title and "rank 0 in wait_for_peers" in f.title, text
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)


def test_a_seed_format_rank_that_exited_0_inside_the_last_step_is_named(tmp_path, matrix, monkeypatch):
    """The seed's format: each rank's per-step beat is written as the step starts, and only rank 0
    writes a record once a (logged) step is done. Rank 1 beat step 8 of 8 and exited 0; rank 0,
    whose own records say it never completed step 8, waited for it. The stall was headed 'rank 0
    in wait_for_peers' with rank 1 'no stack dump', naming no rank that left: the adapter kept
    the seed's words ('beat'), which say neither whether a step was in progress nor done."""
    matrix.start("rank exits 0 inside the last step, seed format",
                 f"`TEST_TRAINER_FAULT={LAST_STEP_FAULT}` (seedlike_train.py through the seed adapter: its beat of "
                 f"step {STEPS}, then exit 0; the others wait), torchrun x2",
                 "FAIL 'stalled'; the stall finding names rank 1 as having exited 0 early inside the last step "
                 "(its records say no step's end; rank 0's say it had not completed the step) and rank 0 where it waits")
    t0 = time.time()
    rec = _run(tmp_path, "seedlike", {"kind": "torchrun", "nproc": 2}, monkeypatch, fault=LAST_STEP_FAULT)
    assert rec.status == Status.FAIL and rec.reason.startswith("stalled"), rec.reason
    text = _titles(rec)
    [f] = [f for f in find([rec]) if f.title.startswith("stall in")]
    assert f.kind == "departed", text
    assert (f"rank 1 exited 0 early (last heartbeat step {STEPS} of {STEPS}, stage data: step {STEPS} started; its "
            f"heartbeats record no step's end, and rank 0 had not completed step {STEPS})") in f.title, text
    assert "rank 0 in wait_for_peers" in f.title, text
    assert f"rank 1: last heartbeat step {STEPS}, stage data; no process left to take a stack of" in text, text
    [advice] = recommendations(find([rec]))
    assert "exited 0 before the steps asked for" in advice, advice
    matrix.done(rec.status, rec.reason + " | " + f.title, time.time() - t0, None)


def test_a_rank_torchrun_ended_as_it_exited_0_early_is_named_beside_the_rank_that_swallowed_its_broken_collective(
        tmp_path, matrix, monkeypatch):
    """Three ranks; rank 2 leaves slowly (its process group gone, still exiting) and the others catch
    their broken all-reduce and exit 1 silently: torchrun sees a silent exit 1 first and ends rank 2
    with SIGTERM, so nothing says it had left, and the verdict named the rank that exited 1 alone
    ('rank 1 crashed (last heartbeat step 3, stage forward): exit code 1'). Its log and heartbeats
    read as those of a rank merely behind: the verdict names both, and says which came first cannot
    be told (validation/tests/judge/test_diagnosis_silent_exits.py has the runs' evidence of both orderings)."""
    fault = f"quit_swallowed:2@{QUIT_STEP}"
    matrix.start("rank exits 0 early, torchrun ends it before its exit, the others exit 1 silently",
                 f"`TEST_TRAINER_FAULT={fault}` (native_train.py: rank 2's process group destroyed, its exit "
                 "5 s later; the others print one line and exit 1), torchrun x3 (gloo)",
                 "FAIL; the verdict names rank 2 as having exited 0 early (last heartbeat step 2) beside the ranks "
                 "that exited 1, and says which came first cannot be told; never a silent rank alone")
    t0 = time.time()
    rec = _run(tmp_path, "native", {"kind": "torchrun", "nproc": 3}, monkeypatch, fault=fault)
    assert rec.status == Status.FAIL and "crashed" in rec.reason, rec.reason
    assert rec.evidence.rank_failures[2].signal == "SIGTERM", rec.evidence.rank_failures  # the ordering asked for
    c = diagnose(rec)
    silent = sorted(k for k, f in rec.evidence.rank_failures.items() if f.silent)
    assert c is not None and [r.rank for r in c.ranks] == silent and 2 not in silent, verdict_line(rec)
    assert c.or_else is not None and [(r.rank, r.step) for r in c.or_else.ranks] == [(2, QUIT_STEP - 1)], c
    assert "or rank 2 exited 0 early (last heartbeat step 2, stage step)" in verdict_line(rec), verdict_line(rec)
    assert "which came first cannot be told" in verdict_line(rec), verdict_line(rec)
    [advice] = recommendations(find([rec]))
    assert "rank 2 may have exited 0 early" in advice, advice
    matrix.done(rec.status, verdict_line(rec), time.time() - t0, None)
