"""The runbook phases as tests: one test per phase point, parametrized by validation.pytest_plugin
from the runbooks (ids runbook/profile/phase/point), carrying phase, profile and hardware markers.

    pytest -m cpu_profile validation/tests/test_acceptance.py     # the CPU smoke runbook
    pytest -m a100                                                 # the seed runbook, a100 profile
    pytest -m bucket_sweep --profile a100                          # re-run one phase; merges into the store
"""
from __future__ import annotations

import pytest

from validation.judge.findings import of_point
from validation.launch.load import IGNORE_ENV
from validation.judge.findings.headline import verdict_line
from validation.pytest_plugin import session_findings


@pytest.fixture(autouse=True)
def machine_load(monkeypatch):
    """The runbooks' points are real runs, judged with the machine's load (the root conftest has the
    harness's own tests read none)."""
    monkeypatch.delenv(IGNORE_ENV, raising=False)


def test_phase(acceptance_point, harness, record_property):
    rec = harness.run(acceptance_point)
    for name, value in rec.metrics.as_dict().items():
        if value is not None:
            record_property(name, value)
    critical = of_point(rec) if rec.status in ("PASS", "UNMEASURED") else []
    if critical:  # the report is NO-GO for it, as `nsa-validate run` exits
        pytest.fail(f"{rec.status} by its gates, but critical: " + "\n".join(f.title for f in critical)
                    + f"\nartifacts: {harness.results_dir / rec.out_dir}", pytrace=False)
    if rec.status == "UNMEASURED":
        pytest.skip(f"ran and stored; {rec.reason}")
    if rec.status != "PASS":
        tail = "\n".join(rec.evidence.stderr_tail.splitlines()[-10:])
        pytest.fail(f"{rec.status}: {verdict_line(rec)}\nartifacts: {harness.results_dir / rec.out_dir}\n{tail}",
                    pytrace=False)


def test_report(acceptance_pair, request):
    """After the phase points: no critical finding that only shows across them (a throughput
    cliff along a sweep); each point's own failures fail its own test."""
    if hasattr(request.config, "workerinput"):
        pytest.skip("cross-point findings are checked without -n; the report is still rendered at session end")
    critical, n = session_findings(request.config, acceptance_pair)
    if n == 0:
        pytest.skip(f"no phase of {acceptance_pair[0]}/{acceptance_pair[1]} ran in this session")
    assert not critical, "critical findings:\n" + "\n".join(critical)
