"""Runbooks and profiles validate, and every bad input is refused with the file and key named."""
from __future__ import annotations

import re

import pytest
import yaml

from validation import REPO_ROOT, RUNBOOK_DIR
from validation.errors import RunbookError
from validation.runbook.load import available, load_profile, load_runbook
from validation.runbook.plan import expand


@pytest.mark.parametrize("name", available())
def test_shipped_runbooks_expand_for_each_profile(name):
    rb = load_runbook(name)
    for prof in rb.profiles:
        points = expand(rb, load_profile(prof))
        assert points and all(p.phase.name in p.markers for p in points)


def test_seed_runbook_has_every_phase_and_a100_numbers():
    rb = load_runbook("nsa_ddp_a100")
    names = [p.name for p in rb.phases]
    assert names == ["preflight", "sanity", "baseline_ddp", "bucket_sweep", "sdpa_audit", "selection_parity", "nvtx",
                     "single_gpu", "fused_adamw", "long_run", "resume", "scaling_sweep", "fsdp", "real_data"]
    base = [p for p in expand(rb, load_profile("a100")) if p.phase.name == "baseline_ddp"][0]
    [tput] = [g for g in base.gates() if g.metric == "toks_per_s_mean"]
    assert (tput.op, tput.threshold, tput.window.last) == (">=", 39.0, 50)
    assert "multi_gpu" in base.markers and "a100" in base.markers
    sweep = [p.slug for p in expand(rb, load_profile("a100"), ["bucket_sweep"])]
    assert sweep == ["NSA_DDP_BUCKET_MB=25", "NSA_DDP_BUCKET_MB=50", "NSA_DDP_BUCKET_MB=100"]
    assert len(expand(rb, load_profile("a100"), ["scaling_sweep"])) == 6


def test_a_threshold_not_yet_measured_stays_unmeasured_not_invented(tmp_path):
    text = (RUNBOOK_DIR / "profiles" / "h200.yaml").read_text()
    unmeasured = tmp_path / "unmeasured.yaml"
    unmeasured.write_text(re.sub(r"(?m)^  min_toks_per_s: .*$", "  min_toks_per_s: null", text))
    prof = load_profile(str(unmeasured))
    assert prof.thresholds["min_toks_per_s"] is None
    base = expand(load_runbook("nsa_ddp_a100"), prof, ["baseline_ddp"])[0]
    assert [g.threshold for g in base.gates() if g.metric == "toks_per_s_mean"] == [None]


def _write(tmp_path, data):
    p = tmp_path / "rb.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return p


def _rb(**phase):
    return {"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "train", **phase}]}


@pytest.mark.parametrize("data, key, words", [
    ({**_rb(), "extra": 1}, "extra", "unknown key"),
    (_rb(stepz=3), "phases[0].stepz", "unknown key"),
    (_rb(gates=[{"metric": "toks", "op": ">=", "threshold": 1}]), "phases[0].gates[0].metric", "unknown metric"),
    (_rb(gates=[{"metric": "toks_per_s_mean", "op": "__import__('os')", "threshold": 1}]), "phases[0].gates[0].op", "unknown comparison"),
    (_rb(gates=[{"metric": "toks_per_s_mean", "op": ">=", "threshold": "39"}]), "phases[0].gates[0].threshold", "expected a finite number"),
    (_rb(gates=[{"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, "window": "first 5"}]), "phases[0].gates[0].window", "not understood"),
    # loss_finite reads every step: the window was shown beside the gate ('phases', the report) and not applied
    (_rb(gates=[{"metric": "loss_finite", "op": "==", "threshold": 1, "window": "last 5 steps"}]), "phases[0].gates[0].window",
     "metric loss_finite takes no window"),
    (_rb(env={"LD_PRELOAD": "/tmp/x.so"}), "phases[0].env.LD_PRELOAD", "may not be set"),
    # a user's own trainer's variable in a phase's env: the message says where it goes instead
    (_rb(env={"USERT_FAULT": "nan"}), "phases[0].env.USERT_FAULT",
     "a variable of the runbook's own trainer goes in trainer.env, or in trainer.params as {env: NAME}"),
    (_rb(env={"NSA_X": "1; rm -rf /"}), "phases[0].env.NSA_X", "shell characters"),
    (_rb(overrides={"train.seq_len": "512 model.n_layers=99"}), "phases[0].overrides.train.seq_len", "without spaces"),
    (_rb(overrides={"data.path": "../../etc/passwd"}), "phases[0].overrides.data.path", "inside the repository"),
    (_rb(launcher={"kind": "python", "nproc": 2}), "phases[0].launcher.nproc", "torchrun"),
    (_rb(launcher={"kind": "torchrun", "module": "os; id"}), "phases[0].launcher.module", "not allowed"),
    (_rb(launcher={"kind": "torchrun", "torchrun_args": ["--rdzv-endpoint=h:1 --x"]}), "phases[0].launcher.torchrun_args", "--option=value"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "../evil", "kind": "train"}]}, "phases[0].name", "not allowed"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "pytest", "tests": ["../outside.py"]}]}, "phases[0].tests[0]", "inside the repository"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "pytest", "tests": ["t.py"], "pytest_args": ["--rootdir=/"]}]}, "phases[0].pytest_args[0]", "not an allowed"),
    (_rb(sweep={"train.seq_len": []}), "phases[0].sweep.train.seq_len", "non-empty list"),
    # values that print alike made two points of one id: one ran twice, and the report called it stale
    (_rb(sweep={"train.lr": [0.001, "0.001"]}), "phases[0].sweep.train.lr",
     "values 0.001 and '0.001' make the same point (lr=0.001): list each value once"),
    (_rb(sweep={"train.lr": ["a:b", "a_b"]}), "phases[0].sweep.train.lr", "make the same point (lr=a_b)"),
    (_rb(sweep={"train.lr": [0.1, 0.2], "optim.lr": [1, 2]}), "phases[0].sweep",
     "optim.lr and train.lr would name their points alike (lr=...)"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "train"}, {"name": "p", "kind": "train"}]}, "phases[1].name", "duplicate"),
    ({"name": "t", "profiles": ["cpu"]}, "phases", "required key is missing"),
    (_rb(kind="shell"), "phases[0].kind", "not one of"),
    # accepted, then run: {last: true} as a 1-step window; a JUnit metric on a train phase as no data
    (_rb(gates=[{"metric": "loss_mean", "op": "<=", "threshold": 9, "window": {"last": True}}]),
     "phases[0].gates[0].window", "not understood"),
    (_rb(gates=[{"metric": "tests_failed", "op": "==", "threshold": 0}]), "phases[0].gates[0].metric",
     "metric tests_failed reads pytest's JUnit XML, which a train phase does not write; it is a metric of pytest phases"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "pytest", "tests": ["t.py"], "gates": [
        {"metric": "toks_per_s_mean", "op": ">=", "threshold": 1, "window": "last 25 steps"}]}]},
     "phases[0].gates[0].metric", "which a pytest phase does not write; it is a metric of profile and resume and train"),
    (_rb(tests=["t.py"]), "phases[0].tests", "only pytest phases run tests, not kind 'train'"),
    ({"name": "t", "profiles": ["cpu"], "phases": [{"name": "p", "kind": "pytest", "tests": ["t.py"],
                                                    "sweep": {"train.lr": [0.1, 0.2]}}]},
     "phases[0].sweep", "a pytest phase runs no trainer"),
])
def test_bad_runbook_names_file_and_key(tmp_path, data, key, words):
    path = _write(tmp_path, data)
    with pytest.raises(RunbookError) as exc:
        load_runbook(path)
    msg = str(exc.value)
    assert str(path) in msg and f": {key}:" in msg and words in msg


def test_unsafe_yaml_tags_are_refused(tmp_path):
    path = _write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\nprofiles: [cpu]\nphases: []\n")
    with pytest.raises(RunbookError, match="not valid YAML"):
        load_runbook(path)


def test_unregistered_marker_is_refused(tmp_path):
    path = _write(tmp_path, _rb(markers=["nosuchmarker"]))
    with pytest.raises(RunbookError, match=r"phases\[0\]\.markers\[0\]: marker 'nosuchmarker' is not registered"):
        load_runbook(path, known_markers={"gpu"})


def test_gate_threshold_missing_from_profile_names_both_files(tmp_path):
    path = _write(tmp_path, _rb(gates=[{"metric": "toks_per_s_mean", "op": ">=", "threshold": {"profile": "nope"}}]))
    with pytest.raises(RunbookError, match=r"threshold 'nope'.*cpu\.yaml does not define"):
        expand(load_runbook(path), load_profile("cpu"))


def test_profile_not_in_runbook_is_refused():
    with pytest.raises(RunbookError, match="profile 'a100' is not one of"):
        expand(load_runbook("cpu_smoke"), load_profile("a100"))


def test_a_runbooks_profiles_are_names_and_a_missing_one_says_how_to_give_a_file(tmp_path):
    """A user's pass: a runbook naming its own profile 'mycpu' was told '(or give a YAML path)';
    written as a path in the runbook, the profile was then 'not one of this runbook's profiles
    (profile.yaml)' even with --profile profile.yaml. A profile file of one's own is given with
    --profile and named in the runbook by its name:."""
    from validation.runbook.load import runbook_profile

    with pytest.raises(RunbookError, match=r"profiles\[0\]: 'profile\.yaml' is a path: profiles names profiles by "
                                           r"their name: .* given with --profile PATH"):
        load_runbook(_write(tmp_path, {**_rb(), "profiles": ["profile.yaml"]}))
    rb = load_runbook(_write(tmp_path, {**_rb(), "profiles": ["mycpu"]}))
    with pytest.raises(RunbookError, match=r"profiles\[0\]: no profile 'mycpu' under .*; a profile file of your own "
                                           r"is given with --profile PATH, its name: 'mycpu'"):
        runbook_profile(rb, "mycpu")


def test_a_built_in_name_given_with_its_suffix_elsewhere_says_to_drop_it(tmp_path, monkeypatch):
    """A user's pass: `nsa-validate run --runbook cpu_smoke.yaml` outside the checkout read
    'cpu_smoke.yaml: file not found'; with the suffix the name is a path, so the error names the
    built-in and how to give it. A file of that name in the directory is still the one read."""
    from validation.runbook.load import load_profile

    monkeypatch.chdir(tmp_path)
    with pytest.raises(RunbookError, match=r"cpu_smoke\.yaml: file not found in .*; the runbook 'cpu_smoke' under "
                                           r".*runbooks is named without its suffix: --runbook cpu_smoke"):
        load_runbook("cpu_smoke.yaml")
    with pytest.raises(RunbookError, match=r"the profile 'cpu' under .*profiles is named without its suffix: "
                                           r"--profile cpu"):
        load_profile("cpu.yml")
    with pytest.raises(RunbookError, match=r"^elsewhere\.yaml: file not found$"):
        load_runbook("elsewhere.yaml")
    _write(tmp_path, _rb()).rename(tmp_path / "cpu_smoke.yaml")
    assert load_runbook("cpu_smoke.yaml").name == _rb()["name"]


def test_bad_profile_names_key(tmp_path):
    p = tmp_path / "prof.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "marker": "x", "hardware": {"accelerator": "tpu"}, "thresholds": {}}))
    with pytest.raises(RunbookError, match=r"prof\.yaml: hardware\.accelerator: 'tpu' is not one of"):
        load_profile(p)
    p.write_text(yaml.safe_dump({"name": "x", "marker": "x", "hardware": {"accelerator": "cpu"}, "thresholds": {"t": "fast"}}))
    with pytest.raises(RunbookError, match=r"thresholds\.t: expected a finite number or null"):
        load_profile(p)


@pytest.mark.parametrize("typo, meant, value", [("max_toks_regresion", "max_toks_regression", 0.05),
                                                ("spike_windw", "spike_window", 5),
                                                ("golden_loss_rtl", "golden_loss_rtol", 1e-4)])
def test_a_near_miss_of_a_threshold_the_harness_reads_is_refused(tmp_path, typo, meant, value):
    """A custom profile's `max_toks_regresion: 0.05` loaded without a word: nothing read it, so
    `report --baseline` gated no drop at all (GO for a trainer 78% slower than its baseline); a
    misspelt `spike_windw` left the default window in force."""
    p = tmp_path / "prof.yaml"
    p.write_text(f"name: x\nmarker: x\nhardware: {{accelerator: cpu}}\nthresholds: {{min_toks_per_s: 1, {typo}: 0.5}}\n")
    with pytest.raises(RunbookError, match=rf"prof\.yaml: thresholds\.{typo}: did you mean {meant}\?"):
        load_profile(p)
    p.write_text(f"name: x\nmarker: x\nhardware: {{accelerator: cpu}}\nthresholds: {{min_toks_per_s: 1, {meant}: {value}}}\n")
    assert load_profile(p).thresholds[meant] == value  # the name itself, and names gates use, load


@pytest.mark.parametrize("key, value, bound", [
    ("max_toks_regression", "5", ">= 0 and < 1"), ("max_toks_regression", "1", ">= 0 and < 1"),
    ("max_toks_regression", "-0.1", ">= 0 and < 1"), ("golden_loss_rtol", "-1.0e-4", ">= 0"),
    ("resume_loss_rtol", "-1.0", ">= 0"), ("min_long_context_speedup", "0", "> 0")])
def test_a_threshold_the_harness_reads_outside_its_range_is_refused(tmp_path, key, value, bound):
    """`max_toks_regression: 5` (meant as 5%) loaded, and the baseline gate passed a 61% drop
    (GO): a drop fraction of 1 or more allows any drop; negative tolerances and speed-ups would
    fail every run or none."""
    p = tmp_path / "prof.yaml"
    p.write_text(f"name: x\nmarker: x\nhardware: {{accelerator: cpu}}\nthresholds: {{{key}: {value}}}\n")
    with pytest.raises(RunbookError, match=rf"prof\.yaml: thresholds\.{key}: must be {bound} \("):
        load_profile(p)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_non_finite_number_is_refused_where_a_number_is_asked(tmp_path, value):
    """A profile's `min_toks_per_s: .nan` loaded: its gate failed as 'needs >= nan' and the report
    said the gate had changed since the run (nan != nan); `!=` against it always holds."""
    p = tmp_path / "prof.yaml"
    p.write_text(f"name: x\nmarker: x\nhardware: {{accelerator: cpu}}\nthresholds: {{min_toks_per_s: {value}}}\n")
    with pytest.raises(RunbookError, match=r"thresholds\.min_toks_per_s: expected a finite number or null \(to be "
                                           r"measured\), got -?(nan|inf)"):
        load_profile(p)
    p.write_text(f"name: x\nmarker: x\nhardware: {{accelerator: cpu, peak_bf16_tflops: {value}}}\nthresholds: {{}}\n")
    with pytest.raises(RunbookError, match=r"hardware\.peak_bf16_tflops: expected"):
        load_profile(p)
    rb = _rb()
    rb["phases"][0]["gates"] = [{"metric": "loss_finite", "op": "!=", "threshold": float(value.replace(".", ""))}]
    with pytest.raises(RunbookError, match=r"gates\[0\]\.threshold: expected a finite number or \{profile: KEY\}"):
        load_runbook(_write(tmp_path, rb))


@pytest.mark.parametrize("key", ["lr", "Train.LR"])
def test_a_trainer_param_that_no_override_could_name_is_refused_and_the_format_page_says_so(tmp_path, key):
    """trainer.params took 'lr' (any identifier), a key no phase's override or sweep can set:
    the user learnt that keys are dotted only from the override's error, and the format page
    (generated from validation/runbook/keys.py) did not say it."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "params": {key: {"flag": "--lr"}}}
    path = _write(tmp_path, {**_rb(), "trainer": trainer})
    with pytest.raises(RunbookError) as exc:
        load_runbook(path)
    assert f": trainer.params.{key}: parameter names are dotted lower-case keys like train.lr" in str(exc.value)
    [row] = [ln for ln in (REPO_ROOT / "docs" / "runbook_format.md").read_text().splitlines()
             if ln.startswith("| `params` |")]
    assert "dotted lower-case name" in row and "train.lr" in row, row


def test_a_key_written_twice_in_a_runbook_or_profile_is_an_error_naming_it_its_section_and_both_lines(tmp_path):
    """PyYAML keeps the last value of a duplicated key: a phase with `gates:` twice was judged
    against the second list alone, a profile with a threshold twice against the second number."""
    rb = tmp_path / "rb.yaml"
    rb.write_text("name: dup\nprofiles: [cpu]\nphases:\n  - name: p\n    kind: train\n"
                  "    gates:\n      - {metric: steps_completed, op: '>=', threshold: 100}\n"
                  "    gates:\n      - {metric: loss_finite, op: '==', threshold: 1}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{rb}: key 'gates' appears twice in phases[0] (lines 6 and 8)")):
        load_runbook(rb)
    prof = tmp_path / "prof.yaml"
    prof.write_text("name: p\nmarker: cpu_profile\nhardware: {accelerator: cpu}\nthresholds:\n"
                    "  min_toks_per_s: 100\n  max_loss: 3\n  min_toks_per_s: 1\n")
    with pytest.raises(RunbookError, match=re.escape(f"{prof}: key 'min_toks_per_s' appears twice in thresholds "
                                                     "(lines 5 and 7)")):
        load_profile(prof)


def test_a_trainer_entry_supporting_no_phase_kind_is_an_error_not_the_default(tmp_path):
    """`trainer.phases: []` was read as the default [train]: a trainer said to support nothing ran
    every train phase, GO."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "phases": []}
    path = _write(tmp_path, {**_rb(), "trainer": trainer})
    with pytest.raises(RunbookError, match=re.escape(
            f"{path}: trainer.phases: an empty list names no phase kind the trainer supports (every phase would be "
            "SKIP); list the kinds it supports (train, profile, preflight, resume), or leave the key out for [train]")):
        load_runbook(path)
    del trainer["phases"]
    assert load_runbook(_write(tmp_path, {**_rb(), "trainer": trainer})).trainer.phases == ("train",)


@pytest.mark.parametrize("fmt", ["contract", "seed", "torchtitan"])
def test_tokens_per_step_for_a_format_that_reads_its_own_rate_is_refused(tmp_path, fmt):
    """Only the Hugging Face Trainer's adapter takes trainer.tokens_per_step; the other formats
    ignored it where the runbook loaded it, so a user's rate went unused without a word (and
    check-artifacts --tokens-per-step refuses it for them)."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py", "format": fmt,
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "tokens_per_step": [64]}
    path = _write(tmp_path, {**_rb(), "trainer": trainer})
    with pytest.raises(RunbookError, match=re.escape(
            f"{path}: trainer.tokens_per_step: format {fmt} reads its tokens/s from the trainer's own files, not "
            "from this key (formats that take it: hf_trainer); leave it out")):
        load_runbook(path)
    del trainer["tokens_per_step"]
    assert load_runbook(_write(tmp_path, {**_rb(), "trainer": trainer})).trainer.tokens_per_step is None


@pytest.mark.parametrize("requires, why", [
    ("fla", "expected a list, got str"),
    (["flash-linear-attention"], "'flash-linear-attention': expected a top-level import name"),
    (["fla.models"], "'fla.models': expected a top-level import name"),
    (["fla", "fla"], "'fla' is listed twice"),
])
def test_trainer_requires_takes_top_level_import_names(tmp_path, requires, why):
    """trainer.requires is checked as it loads: a pip name or a dotted module would never be found
    by the import machinery, and every point would be held back as not installed."""
    trainer = {"name": "mine", "root": "tests/trainers", "script": "native_train.py",
               "args": ["--steps", "{steps}", "--out-dir", "{out_dir}"], "requires": requires}
    path = _write(tmp_path, {**_rb(), "trainer": trainer})
    with pytest.raises(RunbookError, match=re.escape(why)):
        load_runbook(path)
    trainer["requires"] = ["fla", "transformers"]
    assert load_runbook(_write(tmp_path, {**_rb(), "trainer": trainer})).trainer.requires == ("fla", "transformers")


def test_a_bad_key_in_defaults_overrides_is_named_there(tmp_path):
    """It was said to be phases[0]'s, where the user wrote none."""
    from validation.tests.conftest import train_phase, write_runbook

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("a"), train_phase("b", overrides={"train.seq_lenn": 64})],
                       defaults={"launcher": {"kind": "python", "module": "nsa.train"},
                                 "overrides": {"train.seq_lenx": 32}})
    with pytest.raises(RunbookError, match=r"rb\.yaml: defaults\.overrides \(override train\.seq_lenx\): "
                                           r"'train\.seq_lenx' is not a key of the trainer's config"):
        load_runbook(rb)
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("a"), train_phase("b", overrides={"train.seq_lenn": 64})],
                       defaults={"launcher": {"kind": "python", "module": "nsa.train"}})
    with pytest.raises(RunbookError, match=r"phases\[1\] \(override train\.seq_lenn\)"):
        load_runbook(rb)


def test_a_config_file_the_trainer_will_not_find_is_refused_when_the_runbook_loads(tmp_path, monkeypatch):
    """user hH's pass: `config: mycfg.yaml` beside the runbook loaded, and every point then
    launched and failed as 'rank 0 crashed ... config file not found' (NO-GO): this project's
    trainer runs from the checkout and reads its config file from there."""
    from validation.runbook import load
    from validation.tests.conftest import train_phase, write_runbook

    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()], defaults={"config": "mycfg.yaml"})
    with pytest.raises(RunbookError) as exc:
        load_runbook(rb)
    msg = str(exc.value)
    assert f"{rb}: defaults.config: config file 'mycfg.yaml' not found: looked for {REPO_ROOT / 'mycfg.yaml'}" in msg
    assert f"runs from the checkout ({REPO_ROOT}) and reads its config file from there" in msg
    assert "beside the runbook" not in msg
    (tmp_path / "mycfg.yaml").write_text((REPO_ROOT / "nsa" / "configs" / "tiny.yaml").read_text())
    with pytest.raises(RunbookError, match=re.escape(f"; {tmp_path / 'mycfg.yaml'} beside the runbook is not read")):
        load_runbook(rb)
    # a phase's own config is named by its key
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase(), train_phase("other", config="other.yml")])
    with pytest.raises(RunbookError, match=re.escape("phases[1].config: config file 'other.yml' not found")):
        load_runbook(rb)
    # a file in the checkout loads, as do the presets by name or file name
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase()], defaults={"config": "tiny.yaml"})
    assert load_runbook(rb)
    monkeypatch.setattr(load, "REPO_ROOT", tmp_path)  # a checkout holding mycfg.yaml
    assert load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase()], defaults={"config": "mycfg.yaml"}))


from validation.tests.conftest import FAKE, train_phase, write_runbook  # noqa: E402

NSA_TRAIN = {"launcher": {"kind": "python", "module": "nsa.train"}}


@pytest.mark.parametrize("phase, defaults, where, said", [
    # user's pass: `train.batch_size: two` loaded, and its point launched and read as the trainer's
    # crash ("rank 0 crashed ... expected an integer, got 'two'", NO-GO)
    ({"overrides": {"train.batch_size": "two"}}, {}, "phases[1] (override train.batch_size)",
     "train.batch_size: expected an integer, got 'two'"),
    ({"sweep": {"train.batch_size": [1, "2x"]}}, {}, "phases[1] point batch_size=2x (override train.batch_size)",
     "train.batch_size: expected an integer, got '2x'"),
    ({"sweep": {"env.NSA_DDP_BUCKET_MB": [1, "lots"]}}, {},
     "phases[1] point NSA_DDP_BUCKET_MB=lots (sweep env.NSA_DDP_BUCKET_MB)",
     "dist.ddp_bucket_mb: expected an integer, got 'lots' (set by environment variable NSA_DDP_BUCKET_MB='lots')"),
    ({"env": {"NSA_CUDA_GRAPHS": "maybe"}}, {}, "phases[1].env.NSA_CUDA_GRAPHS", "train.cuda_graphs must be one of"),
    ({"overrides": {"dist.mode": "dpp"}}, {}, "phases[1] (override dist.mode)", "dist.mode must be one of"),
    ({}, {"overrides": {"model.attn.window": 0}}, "defaults.overrides (override model.attn.window)",
     "attn.window must be >= 1, got 0"),
    ({"overrides": {"train.steps": 5}}, {}, "phases[1] (override train.steps)",
     "--steps 8 and the override train.steps=5 disagree"),
])
def test_a_value_the_trainer_refuses_is_refused_when_the_runbook_loads(tmp_path, phase, defaults, where, said):
    """A value of the wrong type or out of range (in an override, a sweep point, a variable, the
    defaults) is found when the runbook loads, by the trainer's own check of its config
    (`python -m nsa.train --check-config`, run as a process: the trainer is not imported), naming
    the runbook, where the value was set and what the trainer expected."""
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("a", overrides={"model.attn.window": 16}),
                                              train_phase("b", **phase)],
                       defaults={**NSA_TRAIN, **defaults})
    with pytest.raises(RunbookError) as exc:
        load_runbook(rb)
    msg = str(exc.value)
    assert msg.startswith(f"{rb}: {where}: the trainer refuses it (nsa.train --check-config): "), msg
    assert said in msg and "\n" not in msg, msg


def test_every_value_the_trainer_refuses_is_named_at_once(tmp_path):
    """A runbook with three bad values needed three loadings to find them, one a time. One loading
    names the first bad value of each point (the trainer's check stops at a run's first), each
    once: a bad default refused at every point is named once, where it was set."""
    rb = write_runbook(tmp_path / "rb.yaml", [
        train_phase("a", sweep={"train.batch_size": [1, "2x", "3x"]}),
        train_phase("b", overrides={"dist.mode": "dpp"})], defaults=NSA_TRAIN)
    with pytest.raises(RunbookError) as exc:
        load_runbook(rb)
    msg = str(exc.value)
    assert msg.startswith(f"{rb}: phases[0] point batch_size=2x (override train.batch_size): the trainer refuses "
                          "it (nsa.train --check-config): "), msg
    first, *also = msg.split("; also ")
    assert "train.batch_size: expected an integer, got '2x'" in first, msg
    assert [a.split(": ", 1)[0] for a in also] == ["phases[0] point batch_size=3x (override train.batch_size)",
                                                   "phases[1] (override dist.mode)"], msg
    assert "got '3x'" in also[0] and "dist.mode must be one of" in also[1], msg
    assert "\n" not in msg, msg
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("a", sweep={"train.batch_size": [1, 2]}),
                                              train_phase("b")],
                       defaults={**NSA_TRAIN, "overrides": {"model.attn.window": 0}})
    with pytest.raises(RunbookError) as exc:
        load_runbook(rb)
    msg = str(exc.value)
    assert msg.startswith(f"{rb}: defaults.overrides (override model.attn.window): ") and "; also" not in msg, msg


def test_values_the_trainer_takes_load_and_a_trainer_that_does_not_check_is_left_to_judge_them(tmp_path):
    ok = {"overrides": {"train.batch_size": "2", "train.fused_adamw": True, "model.dropout": 0.1},
          "sweep": {"train.seq_len": [32, 64], "env.NSA_DDP_BUCKET_MB": [1, 4]}}
    assert load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase("a", **ok)], defaults=NSA_TRAIN))
    # the fake trainer answers neither --list-keys nor --check-config: its values are its own to judge
    bad = {"overrides": {"train.batch_size": "two"}}
    assert load_runbook(write_runbook(tmp_path / "rb.yaml", [train_phase("a", **bad)],
                                      defaults={"launcher": {"kind": "python", "module": FAKE}}))
    # a pytest or preflight phase runs no trainer: nothing to check
    assert load_runbook(write_runbook(tmp_path / "rb.yaml", [{"name": "pre", "kind": "preflight"}],
                                      defaults={**NSA_TRAIN, "overrides": {"train.batch_size": "two"}}))


@pytest.mark.parametrize("body", ["raise ImportError('No module named flash_attn_missing')\n", None],
                         ids=["its-import-fails", "no-such-module"])
def test_a_trainer_module_that_cannot_be_imported_is_refused_when_the_runbook_loads(tmp_path, monkeypatch, body):
    """A `launcher.module` whose import fails (or that does not exist) answers `--list-keys` with
    Python's import error, not as a trainer that does not know the flag: it loaded, its typo'd
    override unchecked, and every point then crashed as 'rank 0 crashed'. It is refused, naming the
    phase's launcher.module and Python's line."""
    name = f"brokentrainer_{tmp_path.name.replace('-', '_')}"
    if body is not None:
        (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    rb = write_runbook(tmp_path / "rb.yaml", [train_phase("a", overrides={"train.batchsize": "two"})],
                       defaults={"launcher": {"kind": "python", "module": name}})
    with pytest.raises(RunbookError) as exc:
        load_runbook(rb)
    msg = str(exc.value)
    assert msg.startswith(f"{rb}: phases[0].launcher.module: the trainer cannot be imported here "
                          f"(python -m {name} --list-keys: "), msg
    said = "ImportError: No module named flash_attn_missing" if body else f"No module named {name}"
    assert said in msg and "\n" not in msg, msg


def test_phases_that_differ_only_in_overrides_and_env_are_listed_apart(tmp_path):
    """A user pass: fault phases told apart only by their overrides read alike in `nsa-validate phases`."""
    from validation.runbook.describe import describe

    path = write_runbook(tmp_path / "rb.yaml", [train_phase("hang", env={"NSA_FAULT": "hang"}),
                                                train_phase("crash", env={"NSA_FAULT": "crash"})])
    text = "\n".join(describe(load_runbook(str(path)), load_profile("cpu"), "goldens.yaml"))
    assert "env: NSA_FAULT=hang" in text.split("  crash ")[0] and "env: NSA_FAULT=crash" in text.split("  crash ")[1]
