"""The tests' writer of torchrun's summary (validation/tests/torchrun_summary.py) writes what torch's
own ChildFailedError prints, so that a log a test makes with it reads as torchrun's would."""
from __future__ import annotations

import socket
from datetime import datetime

import pytest

from validation.tests.torchrun_summary import CHILD_FAILED, Failed, child_failed


@pytest.mark.parametrize("root, others", [
    (Failed(1, 702, 1), ()),
    (Failed(1, 702, 1), (Failed(0, 701, -15),)),
    (Failed(1, 702, 1), (Failed(0, 701, -15), Failed(2, 703, -9))),
    (Failed(1, 704, -9), (Failed(0, 703, -15),)),  # every line short: the rules are as wide as the widest
    (Failed(3, 705, 1, local_rank=1), ()),  # a node's second worker of a launch of two nodes
])
def test_the_summary_is_torchs_own(tmp_path, root, others):
    errors = pytest.importorskip("torch.distributed.elastic.multiprocessing.errors")
    stamp = 1796545457
    failures = {}
    for f in (root, *others):  # no error file: torchrun's words for an exit code or a signal
        local = f.rank if f.local_rank is None else f.local_rank
        failures[f.rank] = errors.ProcessFailure(local, f.pid, f.exitcode, str(tmp_path / f"none{f.rank}.json"))
        failures[f.rank].timestamp = stamp
    raised = errors.ChildFailedError("/home/u/mine/train.py", failures)
    time = datetime.fromtimestamp(stamp).isoformat(sep="_")
    assert child_failed("/home/u/mine/train.py", root, *others, time=time, host=socket.getfqdn()) == \
        f"{CHILD_FAILED}{raised}\n"
