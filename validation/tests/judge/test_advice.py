"""Advice only true of the trainer that ran (issue 24, case 6): this project's config keys and "its
last checkpoint is clean" were said of any trainer, collective-hang advice of a single process,
"the stack dumps show" where none were written; and loss_finite passed when the NaN step was
never logged."""
from __future__ import annotations

import dataclasses
import os

import pytest

from validation import REPO_ROOT
from validation.contract.files import HaltInfo
from validation.contract.stacks import Frame, StackDump, TakenStack
from validation.contract.torchrun_log import RankFailure
from validation.judge.findings import Finding, Severity, find, recommendations
from validation.judge.findings.finding import Facts
from validation.judge.gates import GateResult, GateVerdict
from validation.judge.metrics import RunData, compute
from validation.judge.nodes import NodeEvidence, NodesEvidence
from validation.judge.record import HARNESS_ERROR_FILE, Beat, Evidence, NotRun, PhaseRecord, PointKey, Status
from validation.judge.misses import Miss
from validation.judge.verdict import Outcome, process_verdict
from validation.launch import kinds
from validation.session import runs
from validation.tests.conftest import train_phase
from validation.tests.torchrun_summary import Failed, child_failed

OWN = "nsa.train"
FOREIGN = "seed_showcase"


def _record(trainer: str, world: int = 1, dumps: int = 0, **evidence) -> PhaseRecord:
    """A record of ``trainer``'s run with stack dumps of its first ``dumps`` ranks."""
    stack = {r: StackDump(f"stackdump_rank{r}.txt", [Frame("/x/train.py", 3, "wait")]) for r in range(dumps)}
    return PhaseRecord(PointKey("rb", "cpu", "long_run"), "rb/cpu/long_run/default", "train", Status.FAIL, "",
                       trainer=trainer, world_size=world, timeout_s=60, out_dir="runs/x",
                       evidence=Evidence(stackdumps=stack, **evidence))


def _advice(rec: PhaseRecord) -> str:
    return " ".join(recommendations(find([rec])))


def test_nonfinite_advice_names_this_projects_keys_only_for_its_trainer():
    halt = HaltInfo(source="nonfinite", step=3, losses=[float("nan")], grad_norm=1.0)
    own, foreign = _record(OWN, halt=halt), _record(FOREIGN, halt=halt)
    assert "train.lr" in _advice(own) and "last checkpoint is clean" in _advice(own)
    for said in ("train.lr", "train.grad_clip", "checkpoint is clean"):
        assert said not in _advice(foreign)
    [title] = [f.title for f in find([foreign]) if f.kind == "nonfinite"]
    assert "halted before the optimizer step" not in title
    assert "halted before the optimizer step" in next(f.title for f in find([own]) if f.kind == "nonfinite")


def test_stall_advice_speaks_of_collectives_and_dumps_only_where_they_are():
    hung = dict(timed_out=True)
    alone = dataclasses.replace(_record(FOREIGN, dumps=1), **hung)
    assert "collective" not in _advice(alone) and "The stack shows where the process waited" in _advice(alone)
    stepping = {0: Beat(3, "forward"), 1: Beat(3, "backward")}  # in step 3: the ranks' steps diverged
    both = dataclasses.replace(_record(FOREIGN, world=2, dumps=2, last_heartbeat=stepping), **hung)
    assert "The stack dumps show where each rank waited: a rank inside a collective" in _advice(both)
    assert "steps diverged" in _advice(both)
    one = dataclasses.replace(_record(FOREIGN, world=2, dumps=1, last_heartbeat=stepping), **hung)
    assert "The stacks of 1 of 2 ranks (the finding names them)" in _advice(one) and "each rank" not in _advice(one)
    assert "stacks of 1 of 2 ranks were recorded" in next(f for f in find([one]) if f.kind == "stall").detail
    refused = [TakenStack(10 + r, r, "RANK", "none", note="py-spy could not take its stack") for r in range(2)]
    none = dataclasses.replace(_record(FOREIGN, world=2, taken_stacks=refused), **hung)
    assert "stack dumps show" not in _advice(none) and "No stack could be taken" in _advice(none)
    [stall] = [f for f in find([none]) if f.kind == "stall"]
    assert stall.title.endswith(": no stack was recorded")


def test_a_stall_with_no_rank_left_running_gets_no_py_spy_advice_and_no_hung_node():
    """Every rank had ended and node 1's torchrun agent kept the launch open at its exit barrier:
    the harness found no rank's process, and the advice said 'No stack could be taken: install
    py-spy' (py-spy was installed) beside a finding that node 1 'hung'. Rank 1 completed the last
    step (its 'step' record of step 8) and exited; rank 0 failed in its collective after it."""
    nodes = NodesEvidence("torchrun", "localhost:1", 6.0, [
        NodeEvidence(0, "node0.stderr.log", "vm", 1, 8.5, 0, [0]), NodeEvidence(1, "node1.stderr.log", "vm", None, None, 1, [1])])
    peer = RankFailure(exception="RuntimeError: Connection closed by peer [127.0.0.1]:1", exit_code=1)
    rec = dataclasses.replace(_record(FOREIGN, world=2, nodes=nodes, rank_failures={0: peer},
                                      last_heartbeat={0: Beat(8, "backward"), 1: Beat(8, "step")}),
                              steps=8, stalled_s=16.0)
    advice = _advice(rec)
    assert "py-spy" not in advice and "No stack could be taken" not in advice, advice
    assert "No rank was running when the harness stopped the run, so there was no stack to take" in advice, advice
    assert not [f for f in find([rec]) if f.kind == "node_hung"], [f.title for f in find([rec])]
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert stall.title.endswith(": no rank was left running to take a stack of"), stall.title
    assert "rank 1: last heartbeat step 8, stage step; no process left to take a stack of: it had ended (exited 0)" \
        in stall.detail
    # the same run where rank 1's last heartbeat is the 'data' record of step 8 (the step in progress,
    # not completed): it exited 0 inside the last step, and is the cause the stall finding names (it
    # had been passed over: 'no rank was left running', advice naming no rank)
    inside = dataclasses.replace(rec, evidence=dataclasses.replace(
        rec.evidence, last_heartbeat={0: Beat(8, "backward"), 1: Beat(8, "data")}))
    advice = _advice(inside)
    assert "py-spy" not in advice and "exited 0 before the steps asked for" in advice, advice
    assert not [f for f in find([inside]) if f.kind == "node_hung"], [f.title for f in find([inside])]
    [stall] = [f for f in find([inside]) if f.title.startswith("stall in")]
    assert stall.kind == "departed", stall
    assert ("rank 1 exited 0 early (last heartbeat step 8 of 8, stage data: step 8 not completed); no rank was "
            "left running") in stall.title, stall.title
    assert "rank 1: last heartbeat step 8, stage data; no process left to take a stack of: it had ended (exited 0)" \
        in stall.detail


def test_a_start_up_stall_with_one_rank_in_init_process_group_is_not_said_to_be_diverged_steps():
    """Rank 1 slept before init_process_group while rank 0 waited in it, and the start-up
    allowance ended the run: no step had begun, yet the advice said 'the ranks' steps diverged'."""
    dumps = {0: StackDump("harness_stacks/rank0.txt", [Frame("torch/distributed/distributed_c10d.py", 2169,
                                                             "_new_process_group_helper")], source="py-spy"),
             1: StackDump("harness_stacks/rank1.txt", [Frame("/u/mytrain.py", 25, "<module>")], source="py-spy")}
    rec = dataclasses.replace(_record(FOREIGN, world=2), stalled_s=40.0, steps=8,
                              evidence=Evidence(stackdumps=dumps))
    [stall] = [f for f in find([rec]) if f.kind == "stall"]
    assert "hung: rank 1 in <module>; waiting for it: rank 0 in _new_process_group_helper" in stall.title, stall.title
    advice = _advice(rec)
    assert "steps diverged" not in advice and "before any step" in advice and "init_process_group" in advice, advice


def test_host_bound_advice_names_cuda_graphs_only_for_this_trainer_on_cuda():
    def advice(facts: Facts) -> str:
        return recommendations([Finding(Severity.WARNING, "scaling_sweep", "host-bound", kind="host_bound",
                                        facts=facts)])[0]
    assert "train.cuda_graphs" in advice(Facts(own_trainer=True, cuda=True))
    assert "cuda_graphs" not in advice(Facts(own_trainer=True, cuda=False))
    assert "cuda_graphs" not in advice(Facts(own_trainer=False, cuda=True))


def test_loss_finite_fails_when_the_nan_step_was_never_logged(fake_run, tmp_path):
    run = fake_run([train_phase("long_run", fault="nan_unlogged:step=3",
                                gates=[{"metric": "loss_finite", "op": "==", "threshold": 1}])])
    rec = run.record
    assert rec.exit_code == 4 and rec.status == Status.FAIL
    [gate] = rec.gates
    assert gate.metric == "loss_finite" and gate.value == 0.0 and gate.verdict == "FAIL"
    # the exit code alone says it too (contract: 4 = non-finite loss), whatever was logged
    assert compute("loss_finite", RunData(tmp_path, exit_code=4), None) == 0.0


def _gate_failed(trainer: str, metric: str, value: float, threshold: float, **evidence) -> PhaseRecord:
    """A run that exited 0 with one gate of a literal (runbook) threshold failed."""
    gate = GateResult(metric, "==" if metric == "loss_finite" else "<=", threshold, "all steps", value,
                      GateVerdict.FAIL)
    return dataclasses.replace(_record(trainer, **evidence), exit_code=0, gates=[gate])


def test_a_failed_gate_of_the_runbooks_own_threshold_is_not_sent_to_the_profile_file():
    """"compare the value with the threshold's source (the profile file)" was said of every failed
    gate, also of `toks_per_s_cv <= 0.2` written in the runbook itself."""
    advice = _advice(_gate_failed(FOREIGN, "toks_per_s_cv", 0.33, 0.2))
    assert "A gate failed" in advice and "(the profile file)" not in advice


def test_a_nan_the_trainer_logged_and_went_on_from_gets_the_nonfinite_advice():
    """A trainer that logged NaN from step 30 and exited 0 got "A gate failed: compare the value with
    the threshold's source" for its loss_finite gate; and this project's trainer, had it gone on,
    would have been told its last checkpoint is clean."""
    for trainer in (FOREIGN, OWN):
        advice = _advice(_gate_failed(trainer, "loss_finite", 0.0, 1.0, nonfinite_loss_step=30))
        assert "The loss went non-finite" in advice and "did not stop on it" in advice, advice
        assert "A gate failed" not in advice and "checkpoint is clean" not in advice


def test_shared_timing_advice_does_not_offer_jobs_1():
    """`nsa-validate run --jobs 1` was offered, though the CLI always runs timed points alone: they
    share the machine only with another harness process (a second nsa-validate, pytest -n)."""
    finding = Finding(Severity.WARNING, "several", "timings unreliable", [], "timing", Facts())
    [advice] = recommendations([finding])
    assert "--jobs 1" not in advice and "another" in advice


def _fake_slurm(tmp_path, monkeypatch, refuse_after_s: float = 0) -> None:
    """Slurm's tools on PATH, whose salloc refuses every request (what a wrong partition gets),
    after ``refuse_after_s`` seconds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("srun", "squeue", "scancel", "scontrol"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "salloc").write_text(f'#!/bin/sh\nsleep {refuse_after_s}\n'
                                    'echo "salloc: error: invalid partition specified: gpu" >&2\nexit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def test_a_point_whose_launch_failed_is_not_launched_with_advice_of_its_own(tmp_path, monkeypatch, fake_run):
    """salloc refused the allocation: the point's finding listed training.csv, heartbeats and
    env.json as 'missing (not written)' and its advice said 'The trainer broke its output
    contract ... fix the writer', of a trainer that never ran."""
    _fake_slurm(tmp_path, monkeypatch)
    run = fake_run([train_phase(stall_s=60, timeout_s=120, launcher={
        "kind": "slurm", "nodes": 2, "nproc_per_node": 1, "module": "validation.tests.fake_trainer",
        "rdzv": {"join_timeout_s": 5}})])
    rec = run.record
    assert rec.status == Status.ERROR and rec.evidence.not_run == NotRun.LAUNCH
    assert rec.reason.startswith("launch: salloc --no-shell") and "invalid partition specified: gpu" in rec.reason
    assert rec.evidence.errors == [rec.reason]  # no contract file is 'missing' of a run that never started
    [f] = [f for f in run.context["findings"] if f.phase == "baseline_ddp"]  # read back from the store
    assert f.kind == "not_launched" and "baseline_ddp [default] was not launched, nothing ran: launch: salloc" in f.title
    assert f"the launcher's output: {rec.out_dir}/salloc.stderr.log" in f.detail[0]
    # the re-run line runs as printed from any directory and stores into this report's results
    # directory: it named 'validation/tests/...' relative to the repository root and no --results-dir
    assert f.detail[-1] == (f"re-run only this point: `pytest {REPO_ROOT}/validation/tests/test_acceptance.py -m "
                            f"baseline_ddp --runbook {run.runbook.cli_name} --profile cpu "
                            f"--results-dir={run.results.resolve()}`")
    advice = " ".join(run.context["recommendations"])
    assert "The point never started: its launch failed before any trainer process ran" in advice, advice
    assert "output contract" not in advice and "fix the writer" not in advice


def test_a_point_the_harness_failed_on_has_advice_of_its_own(tmp_path, monkeypatch, fake_run):
    def broken(*args, **kwargs):
        raise RuntimeError("judge broke")

    monkeypatch.setattr(runs, "judge", broken)
    run = fake_run([train_phase()])
    assert run.record.status == Status.ERROR and run.record.evidence.not_run == NotRun.HARNESS
    [f] = [f for f in run.context["findings"] if f.phase == "baseline_ddp"]
    assert f.kind == "harness_error" and f.detail[0] == f"traceback: {run.record.out_dir}/{HARNESS_ERROR_FILE}"
    advice = " ".join(run.context["recommendations"])
    assert "The harness itself failed on the point (a defect of the harness, not of the trainer" in advice
    assert "output contract" not in advice


def test_a_broken_contract_keeps_the_artifacts_advice(fake_run):
    run = fake_run([train_phase(fault="missing_csv")])
    assert run.record.status == Status.ERROR and run.record.evidence.not_run is None
    [f] = [f for f in run.context["findings"] if f.phase == "baseline_ddp"]
    assert f.kind == "artifacts" and "The trainer broke its output contract" in " ".join(run.context["recommendations"])


def test_a_rank_killed_by_a_signal_is_not_told_to_read_its_traceback():
    """user7's pass: rank 1 SIGKILLed (os.kill(pid, 9)) was advised to 'Read the traceback in the
    stderr log': a process killed so leaves none. A rank that raised keeps that advice."""
    killed = dataclasses.replace(_record(FOREIGN, world=2, rank_failures={1: RankFailure(signal="SIGKILL", exit_code=-9)},
                                         last_heartbeat={0: Beat(3, "backward"), 1: Beat(3, "forward")}), exit_code=1)
    said = _advice(killed)
    assert "Read the traceback" not in said and "Rank 1 was killed by SIGKILL" in said, said
    assert "no traceback" in said and "out-of-memory killer" in said, said
    raised = dataclasses.replace(_record(FOREIGN, world=2, rank_failures={1: RankFailure(exception="RuntimeError: x",
                                                                                             exit_code=1)},
                                         last_heartbeat={0: Beat(3, "backward"), 1: Beat(3, "forward")}), exit_code=1)
    assert "Read the traceback" in _advice(raised), _advice(raised)


def test_a_crash_is_told_to_read_a_traceback_only_where_its_log_holds_one(tmp_path):
    """trainer19's pass: `python -m nsa.train` ending on its one-line error (a data path that does not
    exist: '[rank 0] error: ...', exit 2, no traceback) was advised to 'Read the traceback in the
    stderr log'. The advice now follows what the log holds: a traceback, one error line, or neither;
    a record stored before the log was read for a traceback is judged by its tail."""
    from validation.judge.evidence import with_log
    said = "[rank 0] error: tiny.yaml: data.path='nope/missing.txt': no such file or directory\n"
    logs = {"one_line": f"[data] text\n{said}",
            "traceback": f"{said}Traceback (most recent call last):\n  File \"t.py\", line 1\nValueError: bad\n",
            "nothing": "step 1/6 | loss 5.6\n",
            # torchrun's own traceback of a worker that failed, and its summary, say nothing of the worker's
            "torchrun": f"{said}Traceback (most recent call last):\n  File \"run.py\", line 9\n"
                        + child_failed("/x/nsa/train.py", Failed(0, 7, 2))}
    advice = {}
    for name, text in logs.items():
        (tmp_path / name).write_text(text)
        rec = dataclasses.replace(_record(OWN), exit_code=2, evidence=with_log(Evidence(), tmp_path / name))
        advice[name] = _advice(rec)
        stored = dataclasses.replace(rec, evidence=dataclasses.replace(rec.evidence, traceback=None, exception=None))
        assert _advice(stored) == advice[name], name
    assert "Read the traceback" in advice["traceback"]
    for name in ("one_line", "torchrun"):
        assert "Read the traceback" not in advice[name] and "error it printed as one line, no traceback" in advice[name]
    assert "Read the traceback" not in advice["nothing"] and "no traceback and no error line" in advice["nothing"]


# --- points that run no trainer (pytest, preflight) and failed in their own way -------------------

def _check_run(fake_run, monkeypatch, tmp_path, phase: dict, files: dict[str, str] | None = None):
    """``phase`` run through the session with this repository's root replaced by a tree holding ``files``."""
    if files is not None:
        tree = tmp_path / "tree"
        tree.mkdir()
        for name, text in files.items():
            (tree / name).write_text(text)
        monkeypatch.setattr(kinds, "REPO_ROOT", tree)
    run = fake_run([phase])
    [f] = [f for f in run.context["findings"] if f.phase == phase["name"]]  # read back from the store
    return run, f, " ".join(run.context["recommendations"])


_SANITY = {"name": "sanity", "kind": "pytest", "gates": [{"metric": "tests_failed", "op": "<=", "threshold": 0}]}


def test_a_pytest_point_without_junit_xml_is_no_broken_trainer_contract(fake_run, monkeypatch, tmp_path):
    """A test that ended pytest with os._exit(0): the ERROR point's advice said 'The trainer broke
    its output contract (the finding names the file): fix the writer', of a point that runs no trainer."""
    run, f, advice = _check_run(fake_run, monkeypatch, tmp_path, {**_SANITY, "tests": ["test_quit.py"]},
                                {"test_quit.py": "import os\ndef test_q():\n    os._exit(0)\n"})
    rec = run.record
    assert rec.status == Status.ERROR and rec.evidence.misses == [Miss.JUNIT]
    assert f.kind == "no_junit" and f.title.startswith("no test outcome in sanity [default]: ") and \
        "pytest wrote no JUnit XML (pytest exit code 0)" in f.title
    assert f"pytest's output: {rec.out_dir}/pytest.stdout.log" in f.detail[0]
    assert "run the tests alone, from the repository root: python -m pytest test_quit.py" in f.detail
    assert f.detail[-1].startswith(f"re-run only this point: `pytest {REPO_ROOT}/validation/tests/test_acceptance.py "
                                   "-m sanity --runbook ")
    assert f.detail[-1].endswith(f" --profile cpu --results-dir={run.results.resolve()}`")
    assert "pytest ended without a readable JUnit XML" in advice and "os._exit" in advice
    assert "output contract" not in advice and "fix the writer" not in advice


def test_a_pytest_point_whose_test_path_is_not_there_says_so(fake_run):
    """pytest exits 4: the verdict said 'tests failed (exit code 4)', and there was no finding and no advice."""
    run, f, advice = _check_run(fake_run, None, None, {**_SANITY, "tests": ["tests/no_such_file.py"]})
    rec = run.record
    assert rec.status == Status.FAIL and rec.evidence.misses == [Miss.TEST_PATHS]
    assert rec.reason.startswith("pytest could not run the tests as asked (a usage error, or a test path not found): "
                                 "test path(s) not found under ") and rec.reason.endswith("(exit code 4)")
    assert f.kind == "tests_not_run" and "tests/no_such_file.py" in f.detail[0]
    assert "A test path of the phase's `tests:` is not in this checkout" in advice
    assert "output contract" not in advice


def test_a_pytest_point_whose_tests_failed_names_its_junit_and_the_command(fake_run, monkeypatch, tmp_path):
    run, f, advice = _check_run(fake_run, monkeypatch, tmp_path,
                                {**_SANITY, "tests": ["test_f.py"], "pytest_args": ["-k", "bad or good"]},
                                {"test_f.py": "def test_bad():\n    assert 0\n\ndef test_good():\n    pass\n"})
    rec = run.record
    assert (rec.status, rec.reason) == (Status.FAIL, "tests failed (exit code 1)")
    assert f.kind == "tests_failed" and f.title == "tests failed in sanity [default]: 1 failed, 1 passed"
    assert f.detail[0] == f"{rec.out_dir}/junit.xml"
    assert "run the tests alone, from the repository root: python -m pytest test_f.py -k 'bad or good'" in f.detail
    assert "Tests of this repository failed (no trainer ran" in advice


def test_a_preflight_that_could_not_name_the_commit_says_what_to_do(fake_run, monkeypatch, tmp_path):
    """No git checkout and no SOURCE_SHA stamp: no finding and no advice, a verdict of 'preflight
    incomplete (exit code 1)' only."""
    # timeout_s: each command's third of it is collect_env's allowance (its torch import, on a loaded box)
    run, f, advice = _check_run(fake_run, monkeypatch, tmp_path, {
        "name": "preflight", "kind": "preflight", "timeout_s": 180,
        "gates": [{"metric": "preflight_missing", "op": "==", "threshold": 0}]}, {})
    rec = run.record
    assert rec.status == Status.FAIL and rec.evidence.misses == [Miss.GIT_SHA]
    assert rec.reason.startswith("preflight incomplete: git describe failed (exit 128")
    assert f.kind == "preflight" and f"git describe's error output: {rec.out_dir}/git_describe.stderr.log" in f.detail
    assert "`git describe` failed in the repository root" in advice and "SOURCE_SHA" in advice
    assert "output contract" not in advice


def test_a_pytest_point_killed_by_a_signal_is_not_said_to_have_failed_tests():
    outcome = Outcome("pytest", -11, False, None, None, ("x/junit.xml: pytest wrote no JUnit XML",))
    assert process_verdict(outcome) == (Status.FAIL, "pytest was killed by signal 11: x/junit.xml: pytest wrote no "
                                                     "JUnit XML (exit code -11)")


def test_a_point_whose_launch_failed_records_the_time_it_took(tmp_path, monkeypatch, fake_run, capsys):
    """A point that could not launch was 'ERROR (0.0s)' though seconds went by before the launcher
    gave up (a salloc that waits, then refuses): its record's wall time was the 0.0 of a process
    that never started, not the time of what ran."""
    _fake_slurm(tmp_path, monkeypatch, refuse_after_s=0.6)
    run = fake_run([train_phase(stall_s=60, timeout_s=120, launcher={
        "kind": "slurm", "nodes": 2, "nproc_per_node": 1, "module": "validation.tests.fake_trainer",
        "rdzv": {"join_timeout_s": 5}})])
    rec = run.record
    assert rec.status == Status.ERROR and rec.evidence.not_run == NotRun.LAUNCH
    assert 0.6 <= rec.wall_s < 30


@pytest.mark.parametrize("fault, said, told", [
    # a user's trainer logged inf at step 5 alone, finite losses after: 'every step after it trained on
    # non-finite values' said what its CSV does not
    ("nan_logged:step=3:inf=1:once=1", "first non-finite loss logged at step 3, the only one: the losses logged "
     "after it, to step 8, are finite", "(no .HALT), yet the losses it logged after the last non-finite one are "
     "finite: the weights did not keep non-finite values"),
    ("nan_logged:step=3:inf=1", "first non-finite loss logged at step 3: every loss logged from it to step 8 is "
     "non-finite", "(no .HALT), and every loss it logged after it is non-finite too: the run trained on non-finite "
     "values from there"),
])
def test_a_non_finite_loss_the_trainer_went_on_from_is_said_as_its_csv_shows_the_steps_after_it(fake_run, fault,
                                                                                                 said, told):
    run = fake_run([train_phase("long_run", fault=fault, gates=[{"metric": "loss_finite", "op": "==", "threshold": 1}])])
    [f] = [f for f in run.context["findings"] if f.kind == "nonfinite"]
    assert f.detail[0] == said, f.detail
    [advice] = [a for a in run.context["recommendations"] if "went non-finite" in a]
    assert told in advice, advice
    assert "every step after it" not in advice
