"""Bad and hostile input: every case gives ONE clear message naming the file and the key, runs
nothing, and executes no code; no shell is ever spawned from runbook text."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.faults import _util as U
from validation.errors import RunbookError
from validation.runbook.load import load_profile, load_runbook

pytestmark = pytest.mark.faults


def _one_error_line(p: U.Proc, prefix: str) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error" in ln.lower()]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(errs) == 1 and errs[0].startswith(prefix), p.stderr[-3000:]
    return errs[0]


def _cli_refuses(tmp_path: Path, rb: Path, needles: list[str]) -> tuple[U.Proc, str]:
    """``nsa-validate run`` on a bad runbook: exit 2, one line naming file and key, and nothing
    written to the results directory."""
    results = tmp_path / "results"
    p = U.harness("run", "--runbook", str(rb), "--profile", "cpu", "--results-dir", str(results), timeout=60)
    assert p.rc == 2, f"exit {p.rc}:\n{p.stderr[-3000:]}"
    line = _one_error_line(p, "nsa-validate: error: ")
    for n in needles:
        assert n in line, (n, line)
    assert not results.exists() or not any(results.iterdir()), "a refused runbook wrote results"
    return p, line


def _runbook(tmp_path: Path, phase: dict, name: str = "rb.yaml") -> Path:
    return U.write_runbook(tmp_path / name, [phase])


def test_malformed_runbook_yaml(tmp_path, matrix):
    matrix.start("malformed runbook YAML", "runbook with broken indentation / an unclosed bracket, via the CLI",
                 "exit 2, one line naming the file and the line; nothing run")
    rb = tmp_path / "broken.yaml"
    rb.write_text("name: broken\nprofiles: [cpu\nphases:\n  - name: x\n   kind: train\n")
    p, line = _cli_refuses(tmp_path, rb, [str(rb), "not valid YAML"])
    assert 'line 2, column' in p.stderr, p.stderr  # the YAML error's position, in the same message
    rb2 = tmp_path / "wrongtype.yaml"
    rb2.write_text("name: t\nprofiles: [cpu]\nphases:\n  - name: t\n    kind: train\n    steps: many\n")
    _, line2 = _cli_refuses(tmp_path, rb2, [str(rb2), "phases[0].steps", "expected an integer"])
    matrix.done("refused (exit 2)", line.replace(str(tmp_path), "<tmp>")[:160] + " ... | "
                + line2.replace(str(tmp_path), "<tmp>"), p.elapsed, 60.0)


def _trainer_config(tmp_path: Path, text: str) -> tuple[U.Proc, str, Path]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(text)
    p = U.run([U.PY, "-m", "nsa.train", "--config", str(cfg), "--out-dir", str(tmp_path / "out"), "--steps", "1"],
              timeout=60)
    assert p.rc == 2, f"exit {p.rc}:\n{p.stderr[-3000:]}"
    assert not (tmp_path / "out" / "training.csv").exists(), "a refused config started training"
    return p, _one_error_line(p, "[rank 0] error: "), cfg


def test_malformed_config_yaml(tmp_path, matrix):
    matrix.start("malformed config YAML", "trainer `--config` with an unclosed mapping",
                 "trainer exit 2, one line naming the file and line")
    p, line, cfg = _trainer_config(tmp_path, "model:\n  dim: {64\ntrain:\n  steps: 2\n")
    assert str(cfg) in line and "not valid YAML" in line, line
    assert "line 2, column" in p.stderr, p.stderr
    matrix.done("refused (exit 2)", line.replace(str(tmp_path), "<tmp>")[:200], p.elapsed, 60.0)


def test_unknown_config_key(tmp_path, matrix):
    matrix.start("unknown config key", "trainer `--config` with `train.stepz`, and `train.seq_len: lots`",
                 "trainer exit 2, one line naming the file and the dotted key")
    p, line, cfg = _trainer_config(tmp_path, "train:\n  stepz: 3\n")
    assert str(cfg) in line and "train.stepz" in line, line
    _, line2, _ = _trainer_config(tmp_path, "train:\n  seq_len: lots\n")
    assert str(cfg) in line2 and "train.seq_len" in line2, line2
    matrix.done("refused (exit 2)", line.replace(str(tmp_path), "<tmp>") + " | "
                + line2.replace(str(tmp_path), "<tmp>"), p.elapsed, 60.0)


def _hostile(marker: Path) -> str:
    return f"!!python/object/apply:os.system [\"touch {marker}\"]"


def test_hostile_yaml_runbook_and_profile(tmp_path, matrix):
    matrix.start("hostile YAML runbook", "`!!python/object/apply:os.system` as a runbook value, as a whole "
                 "runbook and as a profile", "refused by safe_load (exit 2 naming the file); nothing executed")
    marker = tmp_path / "PWNED"
    rb = tmp_path / "hostile.yaml"
    rb.write_text(f"name: hostile\nprofiles: [cpu]\nphases:\n  - name: x\n    kind: train\n"
                  f"    description: {_hostile(marker)}\n")
    p, line = _cli_refuses(tmp_path, rb, [str(rb), "not valid YAML", "python/object"])
    rb2 = tmp_path / "hostile2.yaml"
    rb2.write_text(_hostile(marker) + "\n")
    with pytest.raises(RunbookError, match="hostile2.yaml: not valid YAML"):
        load_runbook(rb2)
    prof = tmp_path / "prof.yaml"
    prof.write_text(f"name: p\nmarker: cpu_profile\nhardware: {{accelerator: cpu}}\nthresholds:\n  x: {_hostile(marker)}\n")
    with pytest.raises(RunbookError, match="prof.yaml: not valid YAML"):
        load_profile(prof)
    assert not marker.exists(), "hostile YAML executed code"
    matrix.done("refused (exit 2)", line.replace(str(tmp_path), "<tmp>")[:200], p.elapsed, 60.0)


def test_hostile_yaml_config(tmp_path, matrix):
    matrix.start("hostile YAML config", "`!!python/object/apply:os.system` in the trainer's config",
                 "trainer exit 2 naming the file; nothing executed")
    marker = tmp_path / "PWNED"
    p, line, cfg = _trainer_config(tmp_path, f"train:\n  steps: {_hostile(marker)}\n")
    assert str(cfg) in line and "not valid YAML" in line, line
    assert not marker.exists(), "hostile YAML executed code"
    matrix.done("refused (exit 2)", line.replace(str(tmp_path), "<tmp>")[:200], p.elapsed, 60.0)


GATE_CASES = [
    # (gate, the dotted key the message must name)
    ("toks_per_s_mean > 1", "phases[0].gates[0]"),
    ({"metric": "toks_per_s_mean", "op": ">=", "threshold": "__import__('os').system('touch {m}')"},
     "phases[0].gates[0].threshold"),
    ({"metric": "__import__('os').system('touch {m}')", "op": ">=", "threshold": 1}, "phases[0].gates[0].metric"),
    ({"metric": "toks_per_s_mean", "op": "lambda a, b: True", "threshold": 1}, "phases[0].gates[0].op"),
]


def test_gate_written_as_code(tmp_path, matrix):
    matrix.start("gate written as code", "gates as an expression string, and `__import__('os')...` as "
                 "threshold, metric and op", "refused at load, naming file and gate key; nothing evaluated")
    marker = tmp_path / "PWNED"
    lines = []
    for i, (gate, key) in enumerate(GATE_CASES):
        gate = json.loads(json.dumps(gate).replace("{m}", str(marker)))
        rb = _runbook(tmp_path, {"name": "g", "kind": "train", "gates": [gate]}, f"gate{i}.yaml")
        with pytest.raises(RunbookError) as exc:
            load_runbook(rb)
        assert str(rb) in str(exc.value) and key in str(exc.value), str(exc.value)
        lines.append(str(exc.value))
    p, line = _cli_refuses(tmp_path, rb, ["phases[0].gates[0].op"])
    assert not marker.exists()
    matrix.done("refused (exit 2)", lines[1].replace(str(tmp_path), "<tmp>"), p.elapsed, 60.0)


ESCAPES = [
    ({"overrides": {"data.path": "/etc/passwd"}}, "phases[0].overrides.data.path"),
    ({"overrides": {"data.path": "runbooks/../../etc/passwd"}}, "phases[0].overrides.data.path"),
    ({"overrides": {"train.out_dir": "/tmp/elsewhere"}}, "phases[0].overrides.train.out_dir"),
    ({"overrides": {"train.resume": "/tmp/elsewhere/step_0000004.pt"}}, "phases[0].overrides.train.resume"),
    ({"name": "../../escape"}, "phases[0].name"),
    ({"kind": "pytest", "tests": ["../outside/test_x.py"]}, "phases[0].tests[0]"),
    ({"kind": "pytest", "tests": ["/abs/test_x.py"]}, "phases[0].tests[0]"),
    ({"sweep": {"data.path": ["runbooks/cpu_smoke.yaml", "/etc/passwd"]}}, "phases[0].sweep.data.path"),
    ({"sweep": {"train.resume": ["../../elsewhere.pt"]}}, "phases[0].sweep.train.resume"),
    ({"config": "../../etc/cfg"}, "phases[0].config"),
]


def test_runbook_path_outside_its_directory(tmp_path, matrix):
    matrix.start("runbook path outside its directory", "absolute and `..` paths in data.path, train.out_dir, "
                 "train.resume, phase name, test paths, config", "refused at load, naming file and key")
    lines = []
    for i, (extra, key) in enumerate(ESCAPES):
        phase = {"name": "esc", "kind": "train", **extra}
        rb = _runbook(tmp_path, phase, f"esc{i}.yaml")
        with pytest.raises(RunbookError) as exc:
            load_runbook(rb)
        assert str(rb) in str(exc.value) and key in str(exc.value), (key, str(exc.value))
        lines.append(str(exc.value))
    p, line = _cli_refuses(tmp_path, rb, ["phases[0].config"])
    matrix.done("refused (exit 2)", lines[3].replace(str(tmp_path), "<tmp>"), p.elapsed, 60.0)


SHELL = [
    ({"config": "tiny; touch {m}"}, "phases[0].config"),
    ({"overrides": {"train.seq_len": "64; touch {m}"}}, "phases[0].overrides.train.seq_len"),
    ({"overrides": {"train.seq_len": "$(touch {m})"}}, "phases[0].overrides.train.seq_len"),
    ({"env": {"NSA_FAULT": "`touch {m}`"}}, "phases[0].env.NSA_FAULT"),
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "phases[0].env.LD_PRELOAD"),
    ({"launcher": {"kind": "python", "module": "nsa.train && touch {m}"}}, "phases[0].launcher.module"),
    ({"launcher": {"kind": "torchrun", "nproc": 2, "torchrun_args": ["--rdzv-endpoint=$(touch {m})"]}},
     "phases[0].launcher.torchrun_args"),
    ({"kind": "pytest", "tests": ["tests/unit; touch {m}"]}, "phases[0].tests[0]"),
    ({"kind": "pytest", "tests": ["tests/unit"], "pytest_args": ["| touch {m}"]}, "phases[0].pytest_args[0]"),
    ({"sweep": {"env.NSA_DDP_BUCKET_MB": ["25 && touch {m}"]}}, "phases[0].sweep.env.NSA_DDP_BUCKET_MB"),
]


def test_phase_command_with_shell_syntax(tmp_path, matrix):
    matrix.start("phase command with shell syntax", "`;`, `$(...)`, backticks, `&&`, `|` in config, "
                 "overrides, env, module, torchrun args, test paths, pytest args, sweep values",
                 "refused at load naming file and key; nothing run")
    marker = tmp_path / "PWNED"
    lines = []
    for i, (extra, key) in enumerate(SHELL):
        extra = json.loads(json.dumps(extra).replace("{m}", str(marker)))
        rb = _runbook(tmp_path, {"name": "sh", "kind": "train", **extra}, f"sh{i}.yaml")
        with pytest.raises(RunbookError) as exc:
            load_runbook(rb)
        assert str(rb) in str(exc.value) and key in str(exc.value), (key, str(exc.value))
        lines.append(str(exc.value))
    p, line = _cli_refuses(tmp_path, rb, ["phases[0].sweep.env.NSA_DDP_BUCKET_MB"])
    assert not marker.exists()
    matrix.done("refused (exit 2)", lines[1].replace(str(tmp_path), "<tmp>"), p.elapsed, 60.0)


AUDIT_DRIVER = r"""
import json, sys
log = open(sys.argv[1], "a")
SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "csh", "fish"}
def hook(event, args):
    if event == "subprocess.Popen":
        exe, argv = args[0], args[1]
        log.write(json.dumps({"event": event, "exe": str(exe), "argv": [str(a) for a in (argv if isinstance(argv, (list, tuple)) else [argv])]}) + "\n")
    elif event in ("os.system", "os.posix_spawn", "os.exec", "os.spawn"):
        log.write(json.dumps({"event": event, "args": repr(args)[:300]}) + "\n")
    log.flush()
sys.addaudithook(hook)
from validation.cli import main
raise SystemExit(main(sys.argv[2:]))
"""


def test_no_shell_is_spawned_from_runbook_text(tmp_path, matrix):
    """The harness process, audited (sys.addaudithook) while it runs a real phase whose runbook
    carries an env value and overrides: every process it starts is exec'd from an argument list,
    the runbook's values arrive as single argv elements, and no shell is ever started."""
    matrix.start("no shell from runbook text", "audit hook on `subprocess.Popen`/`os.system`/`os.exec*` in the "
                 "harness while it runs a real phase", "every child exec'd from an argv list; no shell; runbook "
                 "values arrive verbatim as single arguments")
    log = tmp_path / "audit.jsonl"
    rb = U.write_runbook(tmp_path / "rb.yaml", [U.fault_phase("audited", steps=2,
                                                              env={"NSA_FAULT": "stall:rank=0:step=99:seconds=1"})])
    t0 = time.monotonic()
    p = U.run([U.PY, "-c", AUDIT_DRIVER, str(log), "run", "--runbook", str(rb), "--profile", "cpu",
               "--results-dir", str(tmp_path / "results"), "--no-plots"], timeout=120)
    assert p.rc == 0, p.stderr[-3000:]
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert events, "the audit hook saw no process start: the harness did not run the phase"
    bad = [e for e in events if e["event"] != "subprocess.Popen"]
    assert not bad, f"os.system / exec / spawn used: {bad}"
    shells = {"sh", "bash", "dash", "zsh", "ksh", "csh", "fish"}
    for e in events:
        assert Path(e["exe"] if e["exe"] != "None" else e["argv"][0]).name not in shells, e
        assert Path(e["argv"][0]).name not in shells and "-c" not in e["argv"][:2], e
    # the trainer's run; its --list-keys and --check-config calls (runbook checking) are the other starts of nsa.train
    trainer = [e for e in events if "nsa.train" in e["argv"] and not {"--list-keys", "--check-config"} & set(e["argv"])]
    assert len(trainer) == 1, events
    argv = trainer[0]["argv"]
    assert argv[0] == sys.executable and argv[1:3] == ["-m", "nsa.train"], argv
    assert any(a.startswith("data.dataset=synthetic ") for a in argv), "overrides must be ONE argument"
    matrix.done("PASS (no shell)", f"{len(events)} process start(s), all argv lists; trainer argv[0] = "
                "sys.executable", time.monotonic() - t0, 120.0)
