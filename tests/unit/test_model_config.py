"""Config validation: every bad key or combination fails at load time naming the key."""
from __future__ import annotations

import pytest

from nsa.config import ConfigError, parse_overrides
from nsa.model.config import ModelConfig, load_model_config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.n_heads=12", "model.n_kv_groups=5"], "model.n_heads=12 must be divisible by model.n_kv_groups=5"),
        (["model.attn.cmp_stride=5"], "attn.cmp_stride=5 must divide attn.cmp_block=32"),
        (["model.attn.cmp_stride=32", "model.attn.sel_block=48"], "attn.cmp_stride=32 must divide attn.sel_block=48"),
        (["model.attn.cmp_block=128", "model.attn.cmp_stride=16"], "attn.cmp_block=128 must be <= attn.sel_block=64"),
        (["model.attn.n_selected=2"], "attn.n_selected=2 must be >= 3"),
        (["model.attn.phi=max"], "attn.phi must be one of"),
        (["model.attn.sel_form=rows"], "attn.sel_form must be one of ('auto', 'tiles', 'blocks')"),
        # a backend name the stage has not: once refused only in the first forward, after set-up
        (["model.attn.backend_win=sdpa"], "attn.backend_win must be one of ('auto', 'torch', 'triton', 'flex', "
                                          "'flash_attn'), got 'sdpa'"),
        (["model.attn.backend_sel=cudnn"], "attn.backend_sel must be one of ('auto', 'torch', 'triton'), got 'cudnn'"),
        (["model.head_dim=63"], "model.head_dim=63 must be even"),
        (["model.head_dim=320"], "model.head_dim=320: the NSA kernels take head dims up to 256"),
        (["model.head_dim=320", "model.attn.backend_cmp=torch", "model.attn.backend_sel=torch"],
         "(attn.backend_win=auto may route to them)"),
        (["model.n_layers=0"], "model.n_layers must be >= 1"),
        (["model.dropout=1"], "model.dropout must be in [0, 1), got 1.0"),
        (["model.attn.window=0"], "attn.window must be >= 1"),
        (["model.n_layer=2"], "unknown config key model.n_layer"),
        (["model.attn.windw=2"], "unknown config key model.attn.windw"),
        (["model.dim=big"], "model.dim: expected an integer, got 'big'"),
        (["model.tie_embeddings=maybe"], "model.tie_embeddings: expected a boolean"),
        (["train.seq_len=2"], "only model.* keys apply"),
        (["model.dim"], "expected key.path=value"),
    ],
)
def test_bad_override_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_model_config("m7c_125m", overrides)
    assert message in str(err.value)


def test_head_dims_past_the_kernels_are_for_the_pytorch_path_and_dense_attention():
    torch_only = "model.attn.backend_cmp=torch model.attn.backend_sel=torch model.attn.backend_win=torch"
    assert load_model_config("m7c_125m", f"model.head_dim=320 {torch_only}").head_dim == 320
    assert load_model_config("m7c_125m", "model.head_dim=320 model.attn.kind=dense").head_dim == 320
    assert load_model_config("m7c_125m", "model.head_dim=256").head_dim == 256


def test_bad_yaml_files_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml: config file not found"):
        load_model_config(str(missing))
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_model_config(str(broken))
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="list.yaml: expected a mapping"):
        load_model_config(str(listy))
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text("model:\n  dim: 64\n  attn:\n    stride: 4\n")
    with pytest.raises(ConfigError, match=r"bad_key.yaml: unknown config key model.attn.stride"):
        load_model_config(str(bad_key))


def test_hostile_yaml_is_refused_without_executing(tmp_path):
    marker = tmp_path / "pwned"
    hostile = tmp_path / "hostile.yaml"
    hostile.write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="hostile.yaml: not valid YAML"):
        load_model_config(str(hostile))
    assert not marker.exists()


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match="unknown config preset 'm9'.*m7c_125m"):
        load_model_config("m9")


def test_overrides_apply_and_coerce():
    cfg = load_model_config("m7c_125m", "model.n_layers=2 model.attn.window=64 model.tie_embeddings=false")
    assert (cfg.n_layers, cfg.attn.window, cfg.tie_embeddings) == (2, 64, False)
    assert parse_overrides(["a.b=1", "a.c=x=y"]) == {"a": {"b": "1", "c": "x=y"}}


def test_m7c_preset_is_the_seed_production_shape():
    cfg = load_model_config("m7c_125m")
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_groups, cfg.head_dim, cfg.vocab_size) == (768, 12, 12, 2, 64, 256)
    a = cfg.attn
    assert (a.cmp_block, a.cmp_stride, a.sel_block, a.n_selected, a.window) == (32, 16, 64, 16, 512)
    assert ModelConfig() == cfg


def test_backend_routing_on_cpu_is_torch_without_fallback_and_forced_unavailable_is_an_error():
    import torch

    from nsa.attention.backends import BackendUnavailable, resolve_route

    for stage in ("cmp", "select", "sel", "win"):
        route = resolve_route(stage, "auto", torch.device("cpu"), torch.float32)
        assert route.backend == "torch" and not route.fallback, route
    with pytest.raises(BackendUnavailable, match="attn.backend_win='flex' cannot run on cpu"):
        resolve_route("win", "flex", torch.device("cpu"), torch.float32)
    with pytest.raises(BackendUnavailable, match="not a backend of the sel stage"):
        resolve_route("sel", "cudnn", torch.device("cpu"), torch.float32)
    with pytest.raises(BackendUnavailable, match="attn.backend_cmp='cudnn' cannot run on cpu"):
        resolve_route("cmp", "cudnn", torch.device("cpu"), torch.bfloat16)


def test_the_backend_names_a_config_takes_are_the_backends_routing_knows():
    """The config checks names without torch (nsa.attention.config.BACKEND_CHOICES); routing holds
    the implementations (nsa.attention.backends.BACKENDS): a backend added to one only is a name the
    config refuses, or one it takes and routing then refuses."""
    from nsa.attention.backends import BACKENDS, STAGE_CONFIG_KEY
    from nsa.attention.config import BACKEND_CHOICES

    assert {STAGE_CONFIG_KEY[stage]: tuple(impls) for stage, impls in BACKENDS.items()} == BACKEND_CHOICES


def test_cudnn_compressed_backend_is_a_candidate_for_half_precision_only():
    """'auto' ranks the cuDNN compressed branch first on CUDA for bf16/fp16 and does not consider
    it for float32 (cuDNN's fused attention has no float32), so float32 reports no cuDNN skip."""
    import torch

    from nsa.attention.backends import resolve_route

    cuda = torch.device("cuda")
    half = resolve_route("cmp", "auto", cuda, torch.bfloat16)
    full = resolve_route("cmp", "auto", cuda, torch.float32)
    if torch.cuda.is_available():
        assert full.backend == "triton" and "cudnn" not in full.reason
        assert half.backend == "cudnn" or "skipped cudnn (" in half.reason, half
        return
    # no GPU here: every CUDA backend is skipped, and the reason lists the ones 'auto' tried
    assert half.reason.index("cudnn (") < half.reason.index("triton (")
    assert "cudnn" not in full.reason and "triton (" in full.reason


@pytest.mark.parametrize("requested", ["cudnn", "auto"])
def test_the_select_stage_under_the_cudnn_compressed_branch_is_named_by_the_triton_code_it_runs(monkeypatch, requested):
    """attn.backend_cmp=cudnn routes the select stage to the Triton top-n, fed by cuDNN's compressed
    branch: no cuDNN top-n exists. Its route said 'cudnn' and reports read 'select: cudnn'; it
    names 'triton' now, and its reason says which config choice brought it there."""
    import dataclasses

    import torch

    from nsa.attention import kernel_branches as kb
    from nsa.attention.backends import BACKENDS, implementation, resolve_route

    # cuDNN as if usable (this machine has no GPU): the route is what is checked, not the kernel
    stub = dataclasses.replace(BACKENDS["select"]["cudnn"], available=lambda device, dtype: (True, "stub cuDNN"))
    monkeypatch.setitem(BACKENDS["select"], "cudnn", stub)
    monkeypatch.setattr("nsa.attention.backends.auto_order", lambda stage, device, dtype: ("cudnn", "torch"))
    route = resolve_route("select", requested, torch.device("cuda"), torch.bfloat16)
    assert route.backend == "triton", route
    assert "attn.backend_cmp=cudnn" in route.reason and "stub cuDNN" in route.reason, route.reason
    assert implementation(route) is kb.triton_select_blocks
