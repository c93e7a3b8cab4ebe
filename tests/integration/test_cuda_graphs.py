"""CUDA-graph training steps (nsa/train/graphs.py): the config key and its fallback reasons on
any machine; on a GPU, that graphed steps train exactly as eager steps do.

Equivalence tolerance (GPU tests): the same kernels run in the same order with or without a
graph; the only run-to-run difference is the order of the float32 atomic adds in the NSA
backward kernels (dk/dv), about 1e-7 relative per step. Loss rel 1e-4 and grad norm rel 1e-3
over the run leave a wide margin, while the bugs a graph invites are large: gradients not
refreshed by the replay (the same grad norm every step), accumulated across steps (grad norm
growing by the step) or stale inputs (the same loss every step)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from nsa.config import ConfigError
from nsa.train import graphs
from nsa.train.cli import run
from nsa.train.config import load_run_config

from .test_train_distributed import launch, steps

# --- the config key and the plan (any machine) ---------------------------------------------


@pytest.mark.parametrize("spelled, setting", [("auto", "auto"), ("1", "on"), ("true", "on"), ("ON", "on"),
                                              ("0", "off"), ("false", "off"), ("off", "off")])
def test_setting_spellings(spelled, setting):
    cfg, _ = load_run_config("tiny", [f"train.cuda_graphs={spelled}"], env={})
    assert cfg.train.cuda_graphs == setting


def test_yaml_booleans_are_settings(tmp_path: Path):
    # YAML 1.1 reads a bare on/off as a boolean
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  cuda_graphs: off\n")
    cfg, _ = load_run_config(str(path), [], env={})
    assert cfg.train.cuda_graphs == "off"


def test_bad_setting_names_the_key():
    with pytest.raises(ConfigError, match=r"train\.cuda_graphs must be one of"):
        load_run_config("tiny", ["train.cuda_graphs=sometimes"], env={})


def test_env_toggle_sets_the_key():
    cfg, resolved = load_run_config("tiny", [], env={"NSA_CUDA_GRAPHS": "0"})
    assert cfg.train.cuda_graphs == "off"
    assert resolved.env_applied["NSA_CUDA_GRAPHS"] == {"key": "train.cuda_graphs", "value": "0"}


def test_plan_on_cuda_single_and_ddp():
    single = graphs.plan("auto", "cuda", "single", "")
    assert single.enabled and single.warmup_steps == graphs.WARMUP_STEPS
    ddp = graphs.plan("on", "cuda", "ddp", "")
    assert ddp.enabled and ddp.warmup_steps == graphs.DDP_WARMUP_STEPS == 11


@pytest.mark.parametrize("device, mode, fault, why", [
    ("cpu", "single", "", "this run is on cpu"),
    ("cuda", "fsdp", "", "FSDP2"),
    ("cuda", "single", "stall:rank=0:step=2", "fault injection"),
])
def test_auto_falls_back_with_the_reason(device, mode, fault, why):
    p = graphs.plan("auto", device, mode, fault)
    assert not p.enabled and why in p.reason and p.reason.startswith("auto: eager steps")
    with pytest.raises(ConfigError, match="train.cuda_graphs=on cannot be honoured"):
        graphs.plan("on", device, mode, fault)


def test_off_is_off_everywhere():
    p = graphs.plan("off", "cuda", "single", "")
    assert not p.enabled and "off by config" in p.reason


def test_env_json_records_the_setting_and_fallback(tmp_path: Path):
    assert run("tiny", [f"train.steps=2 train.device=cpu train.out_dir={tmp_path}"],
               env={"NSA_CUDA_GRAPHS": "auto"}) == 0
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["env_toggles"]["NSA_CUDA_GRAPHS"] == {"key": "train.cuda_graphs", "value": "auto"}
    g = env["cuda_graphs"]
    assert g["setting"] == "auto" and g["enabled"] is False and g["captured"] is False
    assert "CUDA graphs need a CUDA device" in g["reason"]


def test_on_refuses_to_start_on_cpu(tmp_path: Path):
    assert run("tiny", [f"train.steps=2 train.device=cpu train.cuda_graphs=on train.out_dir={tmp_path}"], env={}) == 2


# --- on a GPU: graphed steps train as eager steps do ---------------------------------------

GPU_COMMON = ("model.n_layers=2 train.seq_len=256 train.batch_size=2 train.grad_accum=2 train.lr=1e-3 "
              "train.warmup_steps=0 train.print_every=100 train.save_final=false data.dataset=synthetic")


def _assert_same_curve(got: dict[int, dict], ref: dict[int, dict], loss_rel=1e-4, norm_rel=1e-3):
    assert sorted(got) == sorted(ref)
    for s in ref:
        assert got[s]["loss"] == pytest.approx(ref[s]["loss"], rel=loss_rel), s
        assert got[s]["grad_norm"] == pytest.approx(ref[s]["grad_norm"], rel=norm_rel), s
    norms = [got[s]["grad_norm"] for s in sorted(got)]
    assert len(set(norms)) == len(norms), "grad norm repeats: the replay did not refresh the gradients"


@pytest.mark.gpu
@pytest.mark.parametrize("extra", ["", "train.compile=true", "train.activation_checkpointing=true",
                                   "train.dtype=bfloat16 train.fused_adamw=true"])
def test_graphed_steps_match_eager(tmp_path: Path, extra: str):
    curves = {}
    for setting in ("off", "on"):
        out = tmp_path / setting
        args = f"{GPU_COMMON} {extra} train.steps=8 train.cuda_graphs={setting} train.out_dir={out}"
        assert run("tiny", [args], env={}) == 0
        curves[setting] = steps(out)
        env = json.loads((out / "env.json").read_text())
        assert env["cuda_graphs"]["captured"] is (setting == "on"), env["cuda_graphs"]
    bf16 = "bfloat16" in extra
    _assert_same_curve(curves["on"], curves["off"], loss_rel=1e-3 if bf16 else 1e-4, norm_rel=1e-2 if bf16 else 1e-3)


@pytest.mark.gpu
def test_a_failed_capture_ends_the_run_with_the_way_out(tmp_path: Path):
    """A host sync inside the step (planted through a fault-free hook: .item() on the loss)
    cannot be captured. The run stops with an error that names train.cuda_graphs=off, and
    env.json says where capture failed. Its own process: a failed capture leaves torch's CUDA
    RNG in capture mode."""
    script = (
        "import sys, torch\n"
        "from nsa.train.cli import main\n"
        "from nsa.train.loop import Trainer\n"
        "real = Trainer.forward_backward\n"
        "def syncing(self, step, batches):\n"
        "    loss = real(self, step, batches)\n"
        "    loss.item()\n"
        "    return loss\n"
        "Trainer.forward_backward = syncing\n"
        "sys.exit(main(sys.argv[1:]))\n")
    p = launch(["-c", script, "--config", "tiny", "--steps", "5", "--out-dir", str(tmp_path),
                "--override", GPU_COMMON], {}, nproc=None)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "train.cuda_graphs=off" in p.stderr
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["cuda_graphs"]["captured"] is False
    assert env["cuda_graphs"]["note"].startswith(f"capture failed at step {graphs.WARMUP_STEPS + 1}")


def _ddp_curves(tmp_path: Path, toggles: dict[str, str], nproc: int | None) -> dict[str, dict[int, dict]]:
    """DDP runs of the tiny model with graphs off ("0") and on ("1"): each one's step records,
    after checking every rank logged the same steps and env.json says whether it captured."""
    curves = {}
    for setting in ("0", "1"):
        out = tmp_path / setting
        p = launch(["-m", "nsa.train", "--config", "tiny", "--steps", str(graphs.DDP_WARMUP_STEPS + 4),
                    "--out-dir", str(out), "--override", f"{GPU_COMMON} train.dtype=bfloat16 dist.mode=ddp"],
                   {**toggles, "NSA_CUDA_GRAPHS": setting}, nproc=nproc, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        curves[setting] = steps(out)
        for rank in range(1, nproc or 1):
            assert steps(out, rank).keys() == curves[setting].keys()
        env = json.loads((out / "env.json").read_text())
        assert env["dist"]["mode"] == "ddp" and env["cuda_graphs"]["captured"] is (setting == "1"), env["cuda_graphs"]
    return curves


@pytest.mark.gpu
def test_one_process_ddp_graphed_steps_match_eager(tmp_path: Path):
    """DDP over a world of one (NCCL, in this process's GPU): the reducer's bucket views, the bf16
    compression hook and the NCCL all-reduce are captured; the curve equals eager DDP's. The
    two-GPU test below is the full check; this one runs on a one-GPU box."""
    curves = _ddp_curves(tmp_path, {"NSA_DDP_COMPRESS": "bf16", "NSA_DDP_BUCKET_MB": "1"}, nproc=None)
    _assert_same_curve(curves["1"], curves["0"], loss_rel=1e-3, norm_rel=1e-2)


@pytest.mark.multi_gpu
@pytest.mark.parametrize("toggles", [
    {"NSA_DDP_COMPRESS": "bf16", "NSA_DDP_BUCKET_MB": "1", "NSA_DDP_STATIC_GRAPH": "1"},
    {"NSA_DDP_COMPRESS": "none", "NSA_DDP_BUCKET_MB": "25"},
])
def test_ddp_graphed_steps_match_eager(tmp_path: Path, toggles: dict[str, str]):
    """Two GPUs, DDP with the seed runbook's toggles: the graph holds the bucketed (compressed)
    all-reduce of the last micro-batch and none on the first."""
    curves = _ddp_curves(tmp_path, toggles, nproc=2)
    _assert_same_curve(curves["1"], curves["0"], loss_rel=1e-3, norm_rel=1e-2)


@pytest.mark.gpu
def test_step_graph_replays_fresh_inputs():
    """StepGraph alone: each replay computes on the batch copied in, not the captured one."""
    dev = torch.device("cuda")
    stream = torch.cuda.Stream(dev)
    w = torch.nn.Parameter(torch.randn(8, 8, device=dev))
    g = graphs.StepGraph(stream)

    def body(batches):
        out = torch.zeros((), device=dev)
        for x, y in batches:
            loss = ((x @ w - y) ** 2).mean()
            loss.backward()
            out += loss.detach()
        return out

    with torch.cuda.stream(stream):
        body([(torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev))])  # eager warm-up
        w.grad = None
        for _ in range(3):
            batches = [(torch.randn(4, 8, device=dev), torch.randn(4, 8, device=dev)) for _ in range(2)]
            got = g.run(batches, body)
            want = sum(((x @ w - y) ** 2).mean() for x, y in batches)
            (want_grad,) = torch.autograd.grad(want, w)
            torch.testing.assert_close(got, want.detach())
            torch.testing.assert_close(w.grad, want_grad)  # replaced, not accumulated across steps
