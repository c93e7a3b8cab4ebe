"""What the harness knows of its machine (validation/machine.py): on a host where no GPU can be
reached it says so without importing torch, which took seconds in every harness process (the CLI,
each pytest acceptance run) only to hear that there is no GPU."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from validation import REPO_ROOT, machine


def test_a_host_with_no_gpu_device_node_is_known_without_torch():
    if not machine.no_gpu_here():
        pytest.skip("this host has a GPU device node (/dev/nvidia*, /dev/kfd or /dev/dxg): torch is asked")
    probe = ("import json, sys; from validation.machine import detect; m = detect(); "
             "print(json.dumps(['torch' in sys.modules, m.torch, m.cuda, m.gpu_names]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    imported, version, cuda, gpus = json.loads(out.stdout)
    import torch

    assert not imported, "detect() imported torch on a host with no GPU device node"
    assert (version, cuda, gpus) == (str(torch.__version__), torch.version.cuda, [])


@pytest.mark.parametrize("platform, nodes, none_here", [
    ("linux", [], True),
    ("linux", ["/dev/nvidia0"], False),
    ("linux", ["/dev/kfd"], False),
    ("linux", ["/dev/dxg"], False),
    ("darwin", [], False),  # only torch can say (Windows alike)
])
def test_no_gpu_is_certain_only_on_linux_without_a_device_node(monkeypatch, platform, nodes, none_here):
    monkeypatch.setattr(machine.sys, "platform", platform)
    monkeypatch.setattr(machine.glob, "glob", lambda pattern: [n for n in nodes if n.startswith(pattern.rstrip("*"))])
    monkeypatch.setattr(machine.os.path, "exists", lambda path: path in nodes)
    assert machine.no_gpu_here() is none_here


#: two cores kept busy, 1.4 of them by other processes, 0.6 by the point's
LOADED = machine.MachineLoad(cores=2, busy_cores=2.0, others_cores=1.4)


@pytest.mark.parametrize("load, busy", [
    (LOADED, True),
    (machine.MachineLoad(2, 2.0, 0.05), False),   # saturated by the point alone
    (machine.MachineLoad(2, 1.2, 1.0), False),    # a core to spare
    (machine.MachineLoad(16, 10.0, 8.0), False),  # others' work on cores the point did not need
    (machine.MachineLoad(2, 2.0, 1.55), True),    # a point on a quarter of a core each step lost 16% beside them
    (machine.MachineLoad(2, 1.8, 0.2), True),     # the edges: 90% in use, a tenth of the cores others'
    (machine.MachineLoad(2, 1.79, 1.79), False),  # 89.5% in use
])
def test_a_machine_is_busy_only_where_others_competed_with_the_point(load, busy):
    assert load.busy is busy
    assert machine.MachineLoad.from_json(json.loads(json.dumps(load.__dict__))) == load


def test_the_busiest_of_a_points_processes_is_the_one_others_took_most_from():
    quiet = machine.MachineLoad(2, 2.0, 0.05)
    assert machine.MachineLoad.busiest([quiet, None, LOADED]) == LOADED
    assert machine.MachineLoad.busiest([None]) is None
    assert abs(LOADED.slowdown - 2 / 0.6) < 1e-9 and machine.MachineLoad(2, 2.0, 0.05).slowdown == 1.0
    assert machine.MachineLoad(2, 2.0, 2.0).slowdown == float("inf")  # the point used no CPU: no bound
    assert LOADED.describe() == "other processes used 1.40 of the 2 cores on average (2.00 in use in all, 0.60 by the point's)"
