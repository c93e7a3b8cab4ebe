"""A rank whose own loss went non-finite halts (its .HALT, a halt record) and stays alive, while the
other ranks wait for it in their collective until the harness's stall watch stops the run: the
verdict is the non-finite loss on that rank at its step, not a stall, and no finding calls the rank
that halted 'hung' or its node a hung node. Judged from the files a real run of a trainer of one's
own left, two torchrun agents on this host, one rank each (heartbeats, .HALT, nodes.json, the
harness's py-spy stacks; trimmed paths), read by the harness's own readers; nothing runs here."""
from __future__ import annotations

import json
from pathlib import Path

from validation.judge.diagnosis import Kind, diagnose
from validation.judge.findings import find, recommendations
from validation.judge.findings.headline import verdict_line
from validation.judge.record import PhaseRecord, PointKey
from validation.tests.stopped_run import judged_stopped_run


def _beat(rank: int, step: int, stage: str, t: float, **extra) -> dict:
    return {"time": 1795822140.0 + t, "rank": rank, "pid": 5851 - rank, "node": rank, "host": "vm", "step": step,
            "stage": stage, **extra}


#: MYT_FAULT=nanlive:1@3: rank 1's loss of step 3 is NaN; it writes a halt record and the .HALT
#: (no loss per rank: it knows only its own) and waits in a loop of its own; rank 0 waits in all_gather
HEARTBEATS = {
    0: [_beat(0, 1, "forward", .428), _beat(0, 1, "step", .455, loss=5.0), _beat(0, 2, "forward", .455),
        _beat(0, 2, "step", .476, loss=2.5), _beat(0, 3, "forward", .476)],
    1: [_beat(1, 1, "forward", .428), _beat(1, 1, "step", .455, loss=5.0), _beat(1, 2, "forward", .455),
        _beat(1, 2, "step", .476, loss=2.5), _beat(1, 3, "forward", .476), _beat(1, 3, "halt", .497, loss=float("nan"))],
}
HALT = {"source": "nonfinite", "step": 3, "text": "rank 1: non-finite loss nan at step 3"}
CSV = ("step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
       "1,5.00000,0.001,18922.7,0.0271,1.0,0.1,0.2\n2,2.50000,0.001,24295.0,0.0211,1.0,0.1,0.2\n")
NOTE = ("[nsa-validate] no progress for 15s at step 3 (the highest its files showed) (stall_s 15): stacks of 2 "
        "process(es) taken (py-spy; harness_stacks/index.json); process tree killed (root pid 5810)\n")
STACKS = {
    0: ["all_gather (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:4287)",
        "_exception_logger.<locals>.wrapper (/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83)",
        "loop (/tmp/myt/train.py:65)", "main (/tmp/myt/train.py:30)", "<module> (/tmp/myt/train.py:91)"],
    1: ["loop (/tmp/myt/train.py:61)", "main (/tmp/myt/train.py:30)", "<module> (/tmp/myt/train.py:91)"],
}


def _write_run(out: Path) -> None:
    (out / "env.json").write_text(json.dumps({"contract_version": 2, "world_size": 2, "git_sha": "user",
                                              "tokens_per_step": 512}))
    (out / "training.csv").write_text(CSV)
    (out / ".HALT").write_text(json.dumps(HALT))
    for rank, recs in HEARTBEATS.items():
        (out / f"heartbeat_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    stacks = out / "harness_stacks"
    stacks.mkdir()
    index = []
    for rank, frames in STACKS.items():
        pid = 5851 - rank
        (stacks / f"rank{rank}.txt").write_text(
            f"=== py-spy dump of pid {pid}, rank {rank} (RANK), node {rank}, taken by the harness: no progress for 15s "
            f"at step 3 (the highest its files showed) (stall_s 15) ===\nProcess {pid}: python3 -u /tmp/myt/train.py\n"
            f"Python v3.11.7\n\nThread {pid} (idle): \"MainThread\"\n" + "".join(f"    {fr}\n" for fr in frames))
        index.append({"pid": pid, "rank": rank, "rank_from": "RANK", "method": "py-spy",
                      "path": f"harness_stacks/rank{rank}.txt", "note": "", "node": rank, "state": "sleeping"})
    (stacks / "index.json").write_text(json.dumps(index))
    (out / "nodes.json").write_text(json.dumps({
        "launcher": "torchrun", "nproc_per_node": 1, "rdzv_endpoint": "localhost:43695", "rdzv_id": "a7da47d9e073",
        "join_timeout_s": 20.0, "slurm_job_id": None, "slurm_step": None, "slurm_stopped": None,
        "nodes": [{"index": k, "host": "vm", "pid": 5810 + k, "exit_code": None, "ended_s": None, "group_rank": k,
                   "ranks": {str(k): 5851 - k}, "state": "sleeping", "devices": None} for k in (0, 1)]}))
    for k in (0, 1):
        (out / f"node{k}.stderr.log").write_text(NOTE)
        (out / f"node{k}.stdout.log").write_text("")


def _judged(tmp_path: Path) -> PhaseRecord:
    """The record the harness makes of the run: its readers over the files, then the verdict."""
    out = tmp_path / "run"
    out.mkdir()
    _write_run(out)
    return judged_stopped_run(out, out / "node0.stderr.log", stalled_s=15.0, stacks_tried=2,
                              key=PointKey("mine_nodes", "cpu", "ddp2n"), trainer="my.trainer", out_dir="run")


def test_the_verdict_is_the_non_finite_loss_of_the_rank_that_halted_not_a_stall(tmp_path):
    rec = _judged(tmp_path)
    assert rec.reason.startswith("non-finite loss at step 3"), rec.reason
    c = diagnose(rec)
    assert c is not None and c.kind == Kind.HALTED and [(r.rank, r.node, r.step) for r in c.ranks] == [
        (1, "node 1", 3)], verdict_line(rec)
    assert verdict_line(rec).startswith("node 1's rank 1 halted on a non-finite loss (last heartbeat step 3, stage "
                                        "halt)"), verdict_line(rec)


def test_no_finding_calls_the_rank_that_halted_hung(tmp_path):
    findings = find([_judged(tmp_path)])
    text = "\n".join(f"{f.kind}: {f.title}" for f in findings)
    [nan] = [f for f in findings if f.kind == "nonfinite"]
    assert nan.title.startswith("non-finite loss in ddp2n [default] at step 3: rank 1 halted on it (a halt record), "
                                "the other ranks did not; the trainer's .HALT says"), nan.title
    assert "hung" not in text, text
    assert not [f for f in findings if f.kind in ("stall", "node_hung")], text
    [after] = [f for f in findings if f.kind == "halt_stall"]
    assert after.diagnosis is None, after
    assert ("rank 1 halted at step 3 and did not exit (in loop); still waiting: rank 0 in all_gather"
            in after.title), after.title
    advice = recommendations(findings)
    assert not any("diverged" in a or "py-spy" in a for a in advice), advice
    assert any("did not exit after the trainer's .HALT" in a for a in advice), advice
