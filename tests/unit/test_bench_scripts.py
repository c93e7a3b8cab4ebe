"""The benchmark scripts under bench/ run: each answers --help (its imports resolve), and the
whole-model throughput bench runs a CPU cell with its profile. A GPU session is the wrong place
to find that a script no longer imports (bench/train_throughput.py once imported a function
from a module it had moved out of; bench/gpu/golden_losses.sh once listed its phases with an
import that no longer resolved, so a device call ran the whole runbook instead)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for pattern in ("*.py", "gpu/*.py") for p in (ROOT / "bench").glob(pattern)
                 if '__name__ == "__main__"' in p.read_text())


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


# Each script as `python <script> --help` runs it, one after another in one process, so that torch
# and the project are imported once for all of them (a process each spent most of the time importing
# them again). The environment and sys.path are restored after each script.
HELP_ALL = """
import contextlib, io, json, os, runpy, sys
results = {}
for script in sys.argv[1:]:
    env, path, out = dict(os.environ), list(sys.path), io.StringIO()
    sys.argv, sys.path[0] = [script, "--help"], os.path.dirname(script)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
        code = "returned without exiting"
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    os.environ.clear(); os.environ.update(env); sys.path[:] = path
    results[script] = [code, "usage:" in out.getvalue()]
print(json.dumps(results))
"""


def test_every_bench_script_answers_help():
    r = _run("-c", HELP_ALL, *(str(p) for p in SCRIPTS), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    answers = json.loads(r.stdout.splitlines()[-1])
    wrong = {Path(s).relative_to(ROOT).as_posix(): code for s, (code, usage) in answers.items()
             if code != 0 or not usage}
    assert len(answers) == len(SCRIPTS) and not wrong, f"{wrong}\n{r.stderr[-2000:]}"


def test_golden_losses_lists_the_golden_phases():
    """What bench/gpu/golden_losses.sh runs: the --phase options of h100_single's golden phases."""
    r = _run("bench/gpu/loss_spread.py", "--runbook", "h100_single", "--profile", "h100", "--golden-phases")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["--phase", "determinism"]
    assert "loss_spread.py --runbook h100_single --profile h100 --golden-phases" in \
        (ROOT / "bench/gpu/golden_losses.sh").read_text()


def test_train_throughput_profiles_a_cpu_cell():
    r = _run("bench/train_throughput.py", "--config", "tiny", "--device", "cpu", "--batch-sizes", "1",
             "--seq-lens", "64", "--kinds", "nsa", "dense", "--steps", "1", "--warmup", "1", "--profile", "1",
             "--profile-rows", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith(("| nsa | 1 | 64 |", "| dense | 1 | 64 |"))]
    assert len(rows) == 2 and all(row.rstrip().endswith("| ok |") for row in rows), r.stdout[-2000:]
    assert "# profile of 1 steps, nsa B=1 S=64" in r.stdout


def test_kernel_table_counts_device_events_per_step_by_family():
    """Kernels only (a range's GPU-side copy and the host's ops are not device work), per step,
    each with its family, the longest first."""
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(ROOT))
    from bench.train_throughput import OTHER, kernel_table

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def ev(name, us, device=cuda, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=0, end=us))

    events = [ev("_score_kernel", 3000), ev("_score_kernel", 1000), ev("nvjet_sm90_tst_192x192", 1000),
              ev("triton_poi_fused_mul_silu", 500), ev("bench.steps", 9000, annotation=True),
              ev("aten::mm", 8000, cpu)]
    assert kernel_table(events, n_steps=2) == [
        ("attention: NSA Triton kernels", "_score_kernel", 2.0, 1.0),
        ("matrix products (cuBLAS/CUTLASS)", "nvjet_sm90_tst_192x192", 0.5, 0.5),
        (OTHER, "triton_poi_fused_mul_silu", 0.25, 0.5)]


def test_kernel_counters_tabulates_an_ncu_csv(tmp_path):
    """bench/kernel_counters.py's table of an ncu raw-page CSV in base units: ncu's messages
    before the header skipped, the units row not a launch, duration in us, DRAM bytes from the
    rate and the duration, the busiest pipes (their averages) and the largest stalls by name."""
    csv = tmp_path / "ncu.csv"
    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
    pipe = "sm__inst_executed_pipe_{}.{}.pct_of_peak_sustained_active"
    cols = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes.sum.per_second", pipe.format("xu", "avg"),
            pipe.format("xu", "max"), pipe.format("fma", "avg"), stall.format("long_scoreboard"),
            stall.format("math_pipe_throttle")]
    rows = [["", "", "nsecond", "byte/second", "%", "%", "%", "ratio", "ratio"],
            ["0", "_score_kernel", "2,000,000", "750000000000", "90.5", "99", "20.1", "1.5", "3.25"],
            ["1", "_select_kernel", "500000", "1000000000000", "1", "2", "5", "4.5", "0.1"]]
    csv.write_text("==PROF== Connected to process 1\n"
                   + "\n".join(",".join(f'"{v}"' for v in row) for row in [cols, *rows]) + "\n")
    r = _run("bench/kernel_counters.py", "--table", str(csv))
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stdout.splitlines() if line.startswith("| 0 |") or line.startswith("| 1 |")]
    assert len(lines) == 2 and r.stdout.startswith("2 launches, 2.500 ms")
    score = [c.strip() for c in lines[0].split("|")]
    assert score[2:7] == ["_score_kernel", "2000.0", "80.0%", "1.500", "750"]  # us, share, GB, GB/s
    assert score[-3] == "xu 90, fma 20" and score[-2] == "math_pipe_throttle 3.2, long_scoreboard 1.5"


def test_gpu_idle_sums_the_gaps_by_the_host_ops_that_launched_the_next_kernel():
    """bench/host_profile.py --gaps: the time before each kernel that the previous one left
    idle, under the host ops that launched it (a launch call named by its callers)."""
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(ROOT))
    from bench.host_profile import gpu_idle

    cpu = torch.autograd.DeviceType.CPU

    def ev(id_, name, parent=None):
        return SimpleNamespace(id=id_, name=name, device_type=cpu, cpu_parent=parent)

    node = ev(1, "gated_branchesBackward")
    launch = ev(2, "cuLaunchKernelEx", parent=node)
    mm = ev(3, "aten::mm")
    # (start, end, the launching CPU event's id): an mm, a kernel, a memset overlapping it
    work = [(50, 70, 2), (5, 20, 3), (65, 80, 2)]
    idle = gpu_idle([node, launch, mm], work)
    assert idle.window == 75 and idle.busy == 45
    assert idle.gaps == {"gated_branchesBackward": [30]}
    assert gpu_idle([node, launch, mm], work[:1]) is None
