"""RunConfig: presets, overrides, the env-toggle table, the CLI surface."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from nsa.config import ConfigError
from nsa.yaml_unique import safe_load_unique
from nsa.train.cli import build_parser
from nsa.model.config import load_model_config
from nsa.train.config import ENV_TOGGLES, NOOP_TOGGLES, RunConfig, TrainConfig, load_run_config

RUNBOOK_TOGGLES = [
    "NSA_DDP_BUCKET_MB", "NSA_DDP_COMPRESS", "NSA_DDP_STATIC_GRAPH", "NSA_DDP_FIND_UNUSED",
    "NSA_PREFILL_BATCHED", "NSA_SEL_RANGES_V2", "NSA_SDPA_AUDIT", "NSA_SDPA_FLASH_ONLY",
    "NSA_SDPA_NO_FLASH", "NSA_NVTX", "NSA_OPT_FUSED", "NSA_TB_DISABLE", "NSA_DISABLE_AUX_STATS",
]


def test_m7c_125m_preset_matches_the_design():
    cfg, _ = load_run_config("m7c_125m", env={})
    m, t = cfg.model, cfg.train
    assert (m.dim, m.n_layers, m.n_heads, m.n_kv_groups, m.head_dim, m.vocab_size) == (768, 12, 12, 2, 64, 256)
    assert (m.attn.cmp_block, m.attn.cmp_stride, m.attn.sel_block, m.attn.n_selected, m.attn.window) == (32, 16, 64, 16, 512)
    assert (t.seq_len, t.batch_size, t.grad_accum, t.dtype, t.lr, t.grad_clip) == (2048, 2, 2, "bfloat16", 2e-4, 1.0)
    assert t.warmup_steps > 0


def test_tiny_preset_is_cpu_sized():
    cfg, _ = load_run_config("tiny", env={})
    assert cfg.train.seq_len == 64 and cfg.model.dim == 64 and cfg.train.dtype == "float32"


def test_overrides_apply_and_unknown_keys_name_the_dotted_key():
    cfg, _ = load_run_config("tiny", "train.seq_len=32 model.n_layers=1 dist.ddp_bucket_mb=7", env={})
    assert (cfg.train.seq_len, cfg.model.n_layers, cfg.dist.ddp_bucket_mb) == (32, 1, 7)
    with pytest.raises(ConfigError, match=r"train\.seq_lenn"):
        load_run_config("tiny", "train.seq_lenn=32", env={})
    with pytest.raises(ConfigError, match=r"train\.batch_size"):
        load_run_config("tiny", "train.batch_size=two", env={})
    with pytest.raises(ConfigError, match=r"data\.dataset"):
        load_run_config("tiny", "data.dataset=imagenet", env={})


def test_bad_yaml_file_is_named(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  steps: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml"):
        load_run_config(str(bad), env={})
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(str(tmp_path / "missing.yaml"), env={})
    with pytest.raises(ConfigError, match="unknown config preset"):
        load_run_config("no_such_preset", env={})
    named_otherwise = tmp_path / "run.cfg"  # once "unknown config preset '.../run.cfg'", as if no file were there
    named_otherwise.write_text("train:\n  steps: 2\n")
    with pytest.raises(ConfigError, match=re.escape(f"{named_otherwise}: not taken as a config file: expected a "
                                                    "YAML path ending in .yaml or .yml, or a preset name")):
        load_run_config(str(named_otherwise), env={})


@pytest.mark.parametrize("text", ["", "\n\n", "# train:\n#   steps: 5\n"])
def test_an_empty_config_file_is_an_error_naming_it_not_the_125m_defaults(tmp_path: Path, text):
    """A config file with nothing in it (or only comments) once meant every default: a user who
    passed their file got the m7c_125m model because the file was empty."""
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    said = re.escape(f"{path}: the file holds no settings (empty, or comments only); expected a mapping at the "
                     "top level (sections: ")
    with pytest.raises(ConfigError, match=said + "model, train, data"):
        load_run_config(str(path), env={})
    with pytest.raises(ConfigError, match=said + r"model\)"):
        load_model_config(str(path))
    path.write_text("train:\n  steps: 5\n")  # a file with settings: the rest from the defaults, as before
    assert load_run_config(str(path), env={})[0].train.steps == 5


def test_an_empty_config_argument_is_an_error_not_the_default_preset():
    """``--config "$CFG"`` with CFG unset passed '' and ran the m7c_125m preset."""
    for empty in ("", " "):
        with pytest.raises(ConfigError, match="--config is empty: expected a preset name or a YAML path"):
            load_run_config(empty, env={})
    assert load_run_config(None, env={"CONFIG": "tiny"})[1].config_path.endswith("tiny.yaml")


def test_an_empty_out_dir_is_an_error_not_the_current_directory(tmp_path: Path, monkeypatch, capsys):
    """``--out-dir "$OUT"`` with OUT unset trained into the directory the command ran in: its
    training.csv, heartbeats, env.json and checkpoints/ among the user's files."""
    from nsa.train.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["--config", "tiny", "--out-dir", "", "--steps", "1"]) == 2
    assert "train.out_dir is empty: expected the directory for the run's files" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_bad_value_from_the_command_line_is_said_to_come_from_there_not_the_config_file(tmp_path: Path):
    """``--steps 0`` was reported as 'tiny.yaml: train: train.steps must be >= 1, got 0', as if the
    preset held the value; a user looked in the file for it."""
    with pytest.raises(ConfigError, match=re.escape("train.steps must be >= 1, got 0 (set on the command line: "
                                                    "train.steps=0)")):
        load_run_config("tiny", "train.steps=0", env={})
    with pytest.raises(ConfigError, match=re.escape("attn.window must be >= 1, got 0 (set on the command line: "
                                                    "model.attn.window=0)")):
        load_run_config("tiny", "model.attn.window=0", env={})
    # the environment overrides the command line: the variable is named, the override is not
    with pytest.raises(ConfigError) as err:
        load_run_config("tiny", "dist.ddp_bucket_mb=5", env={"NSA_DDP_BUCKET_MB": "0"})
    assert str(err.value).endswith("got 0 (set by environment variable NSA_DDP_BUCKET_MB='0')"), err.value
    with pytest.raises(ConfigError) as err:  # only the override at fault is named
        load_run_config("tiny", "train.steps=5 train.lr=-1", env={})
    assert str(err.value).endswith("train.lr must be > 0, got -1.0 (set on the command line: train.lr=-1)")
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  steps: 0\n")
    with pytest.raises(ConfigError) as err:  # a value of the file itself: the file is where to look
        load_run_config(str(path), "train.lr=0.1", env={})
    assert str(err.value) == f"{path}: train: train.steps must be >= 1, got 0"


def test_file_datasets_need_a_local_path_but_text_has_a_default():
    for dataset in ("fineweb_edu", "parquet", "jsonl"):
        with pytest.raises(ConfigError, match=r"data\.path is required.*no downloads"):
            load_run_config("tiny", f"data.dataset={dataset}", env={})
    cfg, _ = load_run_config("tiny", "data.dataset=text", env={})  # the standard library's sources
    assert cfg.data.path == ""


@pytest.mark.parametrize("var", RUNBOOK_TOGGLES + ["NSA_FAULT"])
def test_every_toggle_maps_to_an_existing_config_key(var):
    key = ENV_TOGGLES[var]
    section, *rest = key.split(".")
    node = getattr(RunConfig(), section)
    for part in rest:
        node = getattr(node, part)  # AttributeError if the key does not exist


def test_env_toggle_overrides_config_and_is_recorded():
    env = {"NSA_DDP_BUCKET_MB": "50", "NSA_OPT_FUSED": "1", "NSA_PREFILL_BATCHED": "1",
           "NCCL_ALGO": "Ring", "HOME": "/root"}
    cfg, res = load_run_config("tiny", "dist.ddp_bucket_mb=25", env=env)
    assert cfg.dist.ddp_bucket_mb == 50 and cfg.train.fused_adamw == "on"
    assert res.env_applied["NSA_DDP_BUCKET_MB"] == {"key": "dist.ddp_bucket_mb", "value": "50"}
    assert set(res.noop_toggles) == {"NSA_PREFILL_BATCHED"}
    assert res.env_seen == {"NSA_DDP_BUCKET_MB": "50", "NSA_OPT_FUSED": "1",
                            "NSA_PREFILL_BATCHED": "1", "NCCL_ALGO": "Ring"}


def test_bad_env_value_names_the_variable():
    with pytest.raises(ConfigError, match="NSA_DDP_BUCKET_MB"):
        load_run_config("tiny", env={"NSA_DDP_BUCKET_MB": "fifty"})
    with pytest.raises(ConfigError, match="NSA_DDP_COMPRESS"):
        load_run_config("tiny", env={"NSA_DDP_COMPRESS": "int4"})
    with pytest.raises(ConfigError, match="contradict"):
        load_run_config("tiny", env={"NSA_SDPA_FLASH_ONLY": "1", "NSA_SDPA_NO_FLASH": "1"})


def test_noop_toggles_are_a_subset_of_the_table():
    assert set(NOOP_TOGGLES) <= set(ENV_TOGGLES)
    assert {"NSA_PREFILL_BATCHED", "NSA_SEL_RANGES_V2"} <= set(NOOP_TOGGLES)


def test_tb_disable_is_a_noop_only_while_tensorboard_is_off():
    _, res = load_run_config("tiny", env={"NSA_TB_DISABLE": "1"})
    assert "telemetry.tensorboard is off" in res.noop_toggles["NSA_TB_DISABLE"]
    cfg, res = load_run_config("tiny", "telemetry.tensorboard=true", env={"NSA_TB_DISABLE": "1"})
    assert cfg.telemetry.tb_disable is True and "NSA_TB_DISABLE" not in res.noop_toggles


def test_config_env_var_picks_the_file_and_conflicts_are_errors():
    _, res = load_run_config(None, env={"CONFIG": "tiny"})
    assert res.config_path.endswith("tiny.yaml")
    _, res = load_run_config("tiny", env={"CONFIG": "tiny"})
    with pytest.raises(ConfigError, match="disagree"):
        load_run_config("tiny", env={"CONFIG": "m7c_125m"})


def test_env_toggles_are_read_in_one_place_only():
    """No module of nsa/train but config.py reads an NSA_* variable or CONFIG."""
    root = Path(__file__).resolve().parents[2] / "nsa" / "train"
    pattern = re.compile(r"(environ|getenv)[^\n]*(NSA_|CONFIG)")
    offenders = [p.name for p in root.glob("*.py") if p.name != "config.py" and pattern.search(p.read_text())]
    assert offenders == []


def test_cli_surface_is_frozen_and_help_lists_the_toggles():
    parser = build_parser()
    opts = {o for a in parser._actions for o in a.option_strings}
    assert opts == {"-h", "--help", "--config", "--override", "--out-dir", "--steps", "--list-keys", "--check-config"}
    text = parser.format_help()
    for var in ENV_TOGGLES:
        assert var in text


def test_the_runbooks_config_path_resolves_to_the_production_preset():
    """CONFIG=configs/m7c_125m_2xa100_production.yaml, as the seed runbook writes it."""
    cfg, res = load_run_config(None, env={"CONFIG": "configs/m7c_125m_2xa100_production.yaml"})
    base, _ = load_run_config("m7c_125m", env={})
    assert res.config_path.endswith("nsa/configs/m7c_125m_2xa100_production.yaml")
    assert cfg.model == base.model and cfg.train.seq_len == base.train.seq_len
    assert cfg.train.out_dir == "artifacts/m7c_125m_2xa100_prod"


def test_an_out_dir_with_a_space_reaches_the_trainer_whole(tmp_path: Path):
    """`--out-dir "/data/my runs/x"` (and so `nsa-validate run --results-dir "/tmp/qa x"`) was
    split at the space like a space-separated --override: "override 'runs/x': expected key.path=value"."""
    from nsa.train.cli import main
    out = tmp_path / "my runs" / "NSA_DDP_BUCKET_MB=1"  # a sweep point's directory holds an '=' too
    assert main(["--config", "tiny", "--steps", "2", "--out-dir", str(out),
                 "--override", "train.seq_len=32 model.n_layers=1 data.dataset=synthetic train.save_final=false"]) == 0
    assert len((out / "training.csv").read_text().splitlines()) == 3


def test_overrides_as_words_of_their_own(tmp_path: Path, capsys):
    """`python -m nsa.train --config tiny train.seq_len=32` (the spelling of the design and of
    every override in the docs) stopped with argparse's 'unrecognized arguments'; only
    --override 'KEY=VALUE' reached the config. A word without '=' is the config's error, exit 2."""
    from nsa.train.cli import main
    out = tmp_path / "run"
    assert main(["--config", "tiny", "--steps", "1", "--out-dir", str(out), "--override", "model.n_layers=1",
                 "train.seq_len=32", "data.dataset=synthetic", "train.save_final=false"]) == 0
    resolved = json.loads((out / "env.json").read_text())["config"]
    assert resolved["train"]["seq_len"] == 32 and resolved["model"]["n_layers"] == 1  # both reach the config
    assert main(["--config", "tiny", "--out-dir", str(tmp_path / "bad"), "seq_len"]) == 2
    assert "override 'seq_len': expected key.path=value" in capsys.readouterr().err


def test_override_words_on_both_sides_of_an_option(tmp_path: Path):
    """`python -m nsa.train --config tiny train.seq_len=32 --out-dir D model.n_layers=1` stopped with
    "unrecognized arguments: model.n_layers=1": argparse took only the words before the first
    option that followed them."""
    from nsa.train.cli import main
    out = tmp_path / "run"
    assert main(["--config", "tiny", "train.seq_len=32", "--steps", "1", "data.dataset=synthetic",
                 "--out-dir", str(out), "model.n_layers=1", "train.save_final=false"]) == 0
    resolved = json.loads((out / "env.json").read_text())["config"]
    assert resolved["train"]["seq_len"] == 32 and resolved["model"]["n_layers"] == 1


@pytest.mark.parametrize("given,setting", [("true", "on"), ("1", "on"), ("False", "off"), ("0", "off"),
                                           ("auto", "auto"), ("on", "on")])
def test_fused_adamw_spellings(given, setting):
    cfg, _ = load_run_config("tiny", f"train.fused_adamw={given}", env={})
    assert cfg.train.fused_adamw == setting


def test_fused_adamw_refuses_other_words():
    with pytest.raises(ConfigError, match=r"train.fused_adamw must be one of \('auto', 'on', 'off'\)"):
        load_run_config("tiny", "train.fused_adamw=sometimes", env={})


@pytest.mark.parametrize("override, message", [
    ("train.lr=nan", r"train\.lr: expected a finite number, got 'nan'"),
    ("train.lr=inf", r"train\.lr: expected a finite number, got 'inf'"),
    ("train.grad_clip=nan", r"train\.grad_clip: expected a finite number"),
    ("watchdog.timeout_s=inf", r"watchdog\.timeout_s: expected a finite number"),
    ("dist.timeout_s=NaN", r"dist\.timeout_s: expected a finite number"),
    ("train.beta1=1.5", r"train\.beta1 must be in \[0, 1\), got 1\.5"),
    ("train.beta2=-0.1", r"train\.beta2 must be in \[0, 1\)"),
    ("train.weight_decay=-1", r"train\.weight_decay must be >= 0, got -1"),
    ("model.rope_theta=-5", r"model\.rope_theta must be > 0, got -5"),
    ("model.init_std=-1", r"model\.init_std must be > 0, got -1"),
])
def test_values_that_only_fail_inside_torch_or_train_nonsense_are_config_errors(override, message):
    """Each once passed the config: a traceback from torch.optim or faulthandler (exit 1, out_dir
    made), a NaN-loss halt, or a run with nan as its clip or timeout."""
    with pytest.raises(ConfigError, match=message):
        load_run_config("tiny", override, env={})


def test_a_yaml_section_that_is_a_value_is_an_error_even_when_an_override_touches_it(tmp_path: Path):
    """`train: 5` in a file was dropped unseen once any train.* override (or --steps) replaced the
    section, and the run trained on the defaults."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: 5\nmodel:\n  attn: fast\n")
    for override in ("train.steps=1", "model.attn.window=8"):
        with pytest.raises(ConfigError, match=r"bad\.yaml: (train|model\.attn): expected a mapping, got (5|'fast')"):
            load_run_config(str(bad), override, env={})


SECTIONS = [f.name for f in dataclasses.fields(RunConfig)]


@pytest.mark.parametrize("section", SECTIONS + ["model.attn"])
@pytest.mark.parametrize("override", [None, "train.steps=1"])
def test_an_empty_section_is_an_error_naming_the_file_and_key_not_its_defaults(tmp_path: Path, section, override):
    """`train:` with nothing indented under it is null in YAML, and it meant the section's defaults
    (100 steps of the 125M model's schedule for a user whose keys were commented out or not
    indented); an override of a key under it replaced the null unseen."""
    path = tmp_path / "mine.yaml"
    *parent, leaf = section.split(".")
    path.write_text("".join(f"{p}:\n" for p in parent) + "  " * len(parent) + f"{leaf}:\n"
                    + "  " * len(parent) + "#  steps: 3\n")
    said = re.escape(f"{path}: {section}: expected a mapping of its keys, got an empty section (`{leaf}:` with "
                     "nothing indented under it, which YAML reads as null)")
    with pytest.raises(ConfigError, match=said):
        load_run_config(str(path), override, env={})


@pytest.mark.parametrize("section", ["model", "model.attn"])
def test_an_empty_model_section_is_an_error_for_the_model_config_too(tmp_path: Path, section):
    path = tmp_path / "mine.yaml"
    path.write_text("model:\n" if section == "model" else "model:\n  dim: 64\n  attn:\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {section}: expected a mapping of its keys, got an "
                                                    "empty section")):
        load_model_config(str(path))


def test_keys_indented_out_of_their_section_name_the_section_they_belong_to(tmp_path: Path):
    """`train:` followed by unindented keys: each lands at the top level. Every such key is named,
    with the section that has it."""
    path = tmp_path / "mine.yaml"
    path.write_text("train:\nsteps: 3\nseq_len: 64\nwindow: 8\nbogus: 1\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(str(path), env={})
    message = str(info.value)
    assert message.startswith(f"{path}: unknown config keys bogus, seq_len, steps, window; allowed keys under "
                                  "the top level: compat, data, "), message
    assert "; in the wrong section? seq_len is train.seq_len, steps is train.steps, window is model.attn.window" \
        in message, message
    path.write_text("model:\n  dim: 64\n  steps: 3\ntrain:\n  prefetch: 2\n")  # keys in another section
    with pytest.raises(ConfigError, match=re.escape("unknown config key model.steps; allowed keys under model: attn, ")
                       + ".*" + re.escape("; in the wrong section? steps is train.steps")):
        load_run_config(str(path), env={})
    path.write_text("train:\n  prefetch: 2\n")
    with pytest.raises(ConfigError, match=r"train\.prefetch.*; in the wrong section\? prefetch is data\.prefetch$"):
        load_run_config(str(path), env={})


def test_a_key_written_twice_is_an_error_naming_the_file_the_key_its_section_and_both_lines(tmp_path: Path):
    """PyYAML keeps the last value of a duplicated key: `lr:` twice under train trained with the
    second, silently (nsa/yaml_unique.py)."""
    path = tmp_path / "mine.yaml"
    path.write_text("model:\n  n_layers: 2\ntrain:\n  lr: 0.1\n  steps: 3\n  lr: 0.001\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key 'lr' appears twice in train (lines 4 and 6)")):
        load_run_config(str(path), env={})
    path.write_text("model:\n  dim: 64\n  attn: {window: 8}\n  attn: {window: 16}\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key 'attn' appears twice in model (lines 3 and 4)")):
        load_model_config(str(path))
    path.write_text("train:\n  steps: 3\ntrain:\n  steps: 4\n")
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key 'train' appears twice at the top level (lines 1 and 3)")):
        load_run_config(str(path), env={})
    # a merge's key set again is YAML's override, not a duplicate
    path.write_text("base: &b {steps: 3, seq_len: 32}\ntrain:\n  <<: *b\n  steps: 4\n")
    with pytest.raises(ConfigError, match="unknown config key base"):  # read whole; base is no section
        load_run_config(str(path), env={})


def test_a_flag_and_an_override_of_its_key_that_disagree_are_refused(tmp_path: Path, capsys):
    """`python -m nsa.train --config tiny --steps 3 train.steps=-1` ran 3 steps without a word: the
    flag's override was applied last and won. Now the two are refused, both named; agreeing, they run."""
    from nsa.train.cli import main
    assert main(["--config", "tiny", "--steps", "3", "train.steps=-1", "--out-dir", str(tmp_path / "a")]) == 2
    assert "--steps 3 and the override train.steps=-1 disagree" in capsys.readouterr().err
    assert main(["--config", "tiny", "--out-dir", str(tmp_path / "b"), "--override", f"train.out_dir={tmp_path}/c"]) == 2
    assert f"--out-dir {tmp_path}/b and the override train.out_dir={tmp_path}/c disagree" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    out = tmp_path / "run"
    assert main(["--config", "tiny", "--steps", "1", "train.steps=1", "--out-dir", str(out), "train.seq_len=32",
                 "model.n_layers=1", "data.dataset=synthetic", "train.save_final=false"]) == 0


def test_a_key_overridden_twice_with_two_values_is_refused(tmp_path: Path, capsys):
    """`python -m nsa.train --config tiny train.steps=2 train.steps=3` ran 3 steps without a word:
    the last override won. Now it exits 2 naming the key and both values, wherever the two stand
    (words, --override strings); one value given twice runs."""
    from nsa.train.cli import main
    assert main(["--config", "tiny", "train.steps=2", "train.steps=3", "--out-dir", str(tmp_path / "a")]) == 2
    assert "the overrides train.steps=2 and train.steps=3 disagree: give one of them" in capsys.readouterr().err
    assert main(["--config", "tiny", "--override", "train.seq_len=32 model.n_layers=1", "train.seq_len=64",
                 "--out-dir", str(tmp_path / "b")]) == 2
    assert "the overrides train.seq_len=32 and train.seq_len=64 disagree" in capsys.readouterr().err
    assert main(["--config", "tiny", "train.steps=1", "train=5", "--out-dir", str(tmp_path / "c")]) == 2
    assert "earlier overrides set keys under train" in capsys.readouterr().err
    assert not any((tmp_path / d).exists() for d in "abc")
    out = tmp_path / "run"
    assert main(["--config", "tiny", "--override", "train.steps=1 train.seq_len=32", "train.steps=1", "--out-dir",
                 str(out), "model.n_layers=1", "data.dataset=synthetic", "train.save_final=false"]) == 0


def test_a_sequence_longer_than_the_kernels_positions_is_refused_at_start(tmp_path: Path, capsys):
    """`train.seq_len=1000000000000` hung set-up in the FLOPs count (nsa/model/flops.py, closed-form
    since); a length past the int32 positions of the NSA kernels (2**31) is now refused at once,
    naming the key and the bound. 2**31 itself is a config (memory is what refuses it)."""
    from nsa.train.cli import main
    for given in (10**12, 10**22, 2**31 + 1):
        assert main(["--config", "tiny", f"train.seq_len={given}", "--out-dir", str(tmp_path / "a")]) == 2
        assert f"train.seq_len must be at most {2**31} (2**31: the NSA kernels hold a position in int32), got {given}" \
            in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    assert TrainConfig(seq_len=2**31).seq_len == 2**31


@pytest.mark.parametrize("given", ["/nonexistent/exp/tiny.yaml", "exp/tiny.yaml", "../configs/tiny.yaml"])
def test_a_config_path_that_does_not_exist_is_no_preset_of_its_name(given):
    """`--config /nonexistent/exp/tiny.yaml` trained the built-in tiny preset without a word (env.json's
    config_path named nsa/configs/tiny.yaml): a user's own copy, its path mistyped, was replaced by the
    project's. Only the seed runbook's configs/<preset>.yaml stands for a preset."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(given)}: config file not found \(presets: "):
        load_run_config(given, env={})
    assert load_run_config("configs/tiny.yaml", env={})[1].config_path.endswith("nsa/configs/tiny.yaml")


def test_a_config_from_the_environment_that_cannot_be_found_says_where_it_came_from():
    """CONFIG=nosuch with no --config said only "unknown config preset 'nosuch'": a person who gave
    no config could not tell where the name came from."""
    with pytest.raises(ConfigError, match=r"^unknown config preset 'nosuch'; presets: .* \(set by environment "
                                          r"variable CONFIG='nosuch'\)$"):
        load_run_config(None, env={"CONFIG": "nosuch"})


@pytest.mark.parametrize("text, value", [("1.0e12", 1.0e12), ("1e-5", 1e-5), ("-2E3", -2000.0), (".5e1", 5.0),
                                         ("1.0e+3", 1000.0), ("12", 12), ("1_000", 1000)])
def test_a_number_in_exponent_form_is_a_number_as_yaml_1_2_reads_it(text, value):
    # YAML 1.1 (PyYAML's safe_load) reads 1.0e12 as a string: a threshold typed that way was refused
    read = safe_load_unique(f"x: {text}")["x"]
    assert read == value and type(read) is type(value)


@pytest.mark.parametrize("text", ["'1e5'", "v1e5", "1e", "e5", "1.2.3e4"])
def test_text_that_only_looks_like_an_exponent_stays_text(text):
    assert isinstance(safe_load_unique(f"x: {text}")["x"], str)


def test_a_config_file_read_again_gives_its_text_now_and_a_mapping_of_its_own(tmp_path):
    """read_yaml keeps the parse of a text (a runbook's check loads one file for every point): a file
    changed between two reads gives its new values, and a caller changing the mapping it got
    changes no later read's."""
    from nsa.config import read_yaml

    f = tmp_path / "c.yaml"
    f.write_text("train:\n  steps: 3\n")
    first = read_yaml(f)
    first["train"]["steps"] = 99
    assert read_yaml(f) == {"train": {"steps": 3}}
    f.write_text("train:\n  steps: 5\n")
    assert read_yaml(f) == {"train": {"steps": 5}}
