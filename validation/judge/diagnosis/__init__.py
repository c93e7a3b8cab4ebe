"""Who failed, how and where: the one place a failed run's blame is decided, as typed data.

``diagnose(rec)`` reads a record's evidence (torchrun's account of how each rank ended, the last
heartbeats, the stacks the harness took, the .HALT) and returns a frozen ``Diagnosis``: the kind of
failure, the rank(s) it blames with their node, step, stage, innermost frame and cause, another
account the evidence fits as well where which came first cannot be told, and the files that show
it. The findings (validation/judge/findings/) and the point's verdict line render a Diagnosis into
words and decide nothing of their own; tests assert on it.

Its modules, each importing only those listed before it:

* blame.py: what a diagnosis is (``Kind``, ``RankAt``, ``NoStack``, ``Detected``, ``Broken``,
  ``Diagnosis``), and the files and logs that show it;
* beats.py: what a rank's last heartbeat says of its steps;
* collectives.py: where ranks wait, from their stacks: in a collective or not, at which call site,
  and the ranks the others waited for;
* failed.py: the rank that failed first in its own right, from torchrun's account, and how;
* nonfinite.py: a trainer that stopped on a non-finite loss, and its diagnosis;
* mismatch.py: a run a check of its collectives ended (gloo's size check, torch's DETAIL check), and its
  diagnosis;
* left.py: the ranks that left early, ended with exit 0 or remained, and those that left early and were
  still ending when torchrun ended them (how each is known: its docstring);
* outofstep.py: ranks that failed or waited in a collective within a step a rank had completed before it
  exited 0 (the ranks' collectives out of step), and their diagnosis;
* crash.py: the diagnosis of a trainer process that failed with a non-zero exit;
* stall.py: the diagnosis of a trainer process the harness stopped or its watchdog halted;
* decide.py: ``diagnose``, the one diagnosis of a failed point.

Here: the diagnosis and its types; every other name is imported from the module that holds it.
"""
from __future__ import annotations

from validation.judge.diagnosis.blame import Diagnosis, Kind, NoStack, RankAt
from validation.judge.diagnosis.decide import diagnose

__all__ = ["Diagnosis", "Kind", "NoStack", "RankAt", "diagnose"]
