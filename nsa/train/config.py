"""The run config: one YAML with sections model/train/data/dist/telemetry/sdpa/compat/watchdog/
fault, loaded into dataclasses with nsa.config, then dotted overrides, then environment toggles.

Precedence (later wins): dataclass defaults < YAML file < ``--override key=value`` < environment
variable. ``ENV_TOGGLES`` below is the ONLY place the trainer reads environment toggles; every
variable maps to one config key, and the ones that mean nothing for this implementation (or
nothing while another key is off) are accepted, recorded in env.json and reported as no-ops
(``NOOP_TOGGLES``, ``NOOP_UNLESS``).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import contract
from ..config import (ConfigError, disagree, field_paths, from_dict, merge, parse_overrides, read_yaml,
                      resolve_config_path, to_dict)
from ..kernels import MAX_POSITIONS
from ..model.config import ModelConfig

DATASETS = ("synthetic", "pattern", "text", "parquet", "jsonl", "fineweb_edu")
DIST_MODES = ("auto", "single", "ddp", "fsdp")
DTYPES = ("float32", "bfloat16")
COMPRESS = ("none", "bf16", "fp16")
GRAPH_SETTINGS = ("auto", "on", "off")
FUSED_SETTINGS = ("auto", "on", "off")
_BOOL_SPELLINGS = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}


@dataclass
class TrainConfig:
    steps: int = 100
    """Total optimizer steps of the run; the LR schedule spans them (a resumed run ends here too)."""
    run_steps: int = 0
    """Stop this invocation after this many steps (checkpointing), e.g. for a preemptible slot;
    resume later with train.resume=auto. 0: run to train.steps."""
    seq_len: int = 2048
    """Tokens per row (the model sees seq_len inputs and predicts seq_len targets); at most 2**31,
    the positions the NSA kernels index in int32 (nsa.kernels.MAX_POSITIONS)."""
    batch_size: int = 2
    """Rows per micro-batch PER RANK. Global batch = batch_size * grad_accum * world_size."""
    grad_accum: int = 1
    """Micro-batches per optimizer step; gradients sync only on the last one."""
    lr: float = 2e-4
    """Peak learning rate (reached at the end of warm-up)."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at the last step."""
    warmup_steps: int = 100
    """Linear warm-up steps (clamped to the run length)."""
    weight_decay: float = 0.1
    """AdamW weight decay on matrices (norms, biases and gains are not decayed)."""
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    """Max global grad norm; 0 disables clipping (the norm is still logged)."""
    dtype: str = "bfloat16"
    """Compute dtype: bfloat16 (autocast, or the FSDP2 mixed-precision policy) or float32."""
    activation_checkpointing: bool = False
    """Non-reentrant checkpointing of every block (works under DDP and FSDP2)."""
    compile: bool = False
    """torch.compile each block."""
    fused_adamw: str = "auto"
    """AdamW's kernels (env NSA_OPT_FUSED): auto (the fused kernel on CUDA, the foreach kernels
    elsewhere), on, off; 1/0 and true/false mean on/off. Fused on CUDA because the foreach kernels'
    launches leave the GPU idle between a CUDA-graph step's replays (bash bench/gpu/optimizer_gaps.sh
    measures the gap); the seed runbook's fused_adamw phase still sweeps both, and env.json records
    which ran."""
    cuda_graphs: str = "auto"
    """Replay each step's forward and backward as one CUDA graph (env NSA_CUDA_GRAPHS): auto (on
    where it works, eager with the reason recorded in env.json elsewhere: CPU, FSDP2, fault
    injection), on (refuse to start where it cannot work), off. 1/0 mean on/off. See
    nsa/train/graphs.py."""
    seed: int = 1337
    """Seeds model init, RNG and the synthetic data."""
    deterministic: bool = False
    """Deterministic algorithms, cuDNN deterministic and CUBLAS_WORKSPACE_CONFIG, set before any
    CUDA work (env NSA_DETERMINISTIC), so that the same seed gives the same loss curve; what stays
    non-deterministic is listed in env.json (nsa/train/determinism.py)."""
    device: str = "auto"
    """auto (cuda when available), cuda or cpu."""
    out_dir: str = "artifacts/run"
    """Where training.csv, heartbeats, env.json, checkpoints and stack dumps go."""
    log_every: int = 1
    """Write training.csv / step heartbeats every N steps."""
    print_every: int = 10
    """Print a progress line on rank 0 every N steps."""
    ckpt_every: int = 0
    """Save a checkpoint every N steps (0: only the final one, if save_final)."""
    keep_checkpoints: int = 3
    """Keep the newest N checkpoints of out_dir (by step) and remove older ones, each only after
    the new checkpoint and the ``latest`` pointer are written; 0 keeps all. Never removed: the one
    ``latest`` names, the one this run resumed from, and any of a step past the one just saved (an
    earlier run's). 3: the newest, and two to go back to if it turns out damaged or saved after a
    loss spike, where keeping every one fills the disk of a long run (one per train.ckpt_every)."""
    save_final: bool = True
    """Save a checkpoint when the run completes train.steps. A run stopped early (train.run_steps,
    operator .HALT) always saves, so that it can resume."""
    resume: str = ""
    """'' (fresh run), 'auto' (latest checkpoint in out_dir, fresh if none), a checkpoint path, or
    the out_dir of an earlier run (its latest checkpoint; this run writes into its own out_dir)."""
    profile_steps: int = 0
    """Profile this many steps once the run is steady (after the warm-up and the CUDA-graph
    capture step) and write profile.json, profile_top_ops.txt and, on CUDA, gpu_timeline.json.gz;
    the run then goes on to train.steps (env CONTRACT_PROFILE_STEPS, the harness's switch;
    nsa/train/profile.py). 0: no profile."""

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "grad_accum", "log_every", "print_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len > MAX_POSITIONS:
            raise ValueError(f"train.seq_len must be at most {MAX_POSITIONS} (2**31: the NSA kernels hold a position "
                             f"in int32), got {self.seq_len}")
        for name in ("warmup_steps", "ckpt_every", "keep_checkpoints", "run_steps", "profile_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.weight_decay < 0:
            raise ValueError(f"train.weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip < 0:
            raise ValueError(f"train.grad_clip must be >= 0 (0 disables), got {self.grad_clip}")
        if self.dtype not in DTYPES:
            raise ValueError(f"train.dtype must be one of {DTYPES}, got {self.dtype!r}")
        spelled = str(self.cuda_graphs).strip().lower()
        self.cuda_graphs = _BOOL_SPELLINGS.get(spelled, spelled)
        if self.cuda_graphs not in GRAPH_SETTINGS:
            raise ValueError(f"train.cuda_graphs must be one of {GRAPH_SETTINGS} (or 1/0), got {self.cuda_graphs!r}")
        spelled = str(self.fused_adamw).strip().lower()
        self.fused_adamw = _BOOL_SPELLINGS.get(spelled, spelled)
        if self.fused_adamw not in FUSED_SETTINGS:
            raise ValueError(f"train.fused_adamw must be one of {FUSED_SETTINGS} (or 1/0, true/false), "
                             f"got {self.fused_adamw!r}")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ValueError(f"train.device must be auto, cuda or cpu, got {self.device!r}")
        if not self.out_dir.strip():  # Path("") is the current directory, wherever the run was started
            raise ValueError("train.out_dir is empty: expected the directory for the run's files "
                             "('.' for the current directory)")


@dataclass
class DataConfig:
    dataset: str = "synthetic"
    """synthetic (uniform random bytes), pattern (learnable repeating ramps), text (plain text
    files; without data.path the Python standard library's own .py sources, nsa/train/corpus.py),
    parquet / jsonl (a text column), fineweb_edu (parquet or jsonl by file suffix)."""
    path: str = ""
    """Local file, directory or glob for text/parquet/jsonl/fineweb_edu. Never downloaded. Empty
    for text: the standard library's sources of the Python that runs, read in place. Of a directory
    or a glob only the dataset's files are read: parquet *.parquet, jsonl *.jsonl and *.json,
    fineweb_edu all three, text every file; a file named alone is read whatever its suffix."""
    text_column: str = "text"
    """Column (parquet) or key (jsonl) holding the document text."""
    tokenizer: str = "byte"
    """Only 'byte' (UTF-8 bytes, vocab 256) exists."""
    loader_timeout_s: float = 120.0
    """Fail with a clear error when no batch arrives within this many seconds."""
    prefetch: int = 4
    """Batches the background loader keeps ready."""
    pattern_period: int = 7
    """Period of the ramps of the 'pattern' dataset."""

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"data.dataset must be one of {DATASETS}, got {self.dataset!r}")
        if self.tokenizer != "byte":
            raise ValueError(f"data.tokenizer must be 'byte' (the only tokenizer), got {self.tokenizer!r}")
        if self.loader_timeout_s <= 0:
            raise ValueError(f"data.loader_timeout_s must be > 0, got {self.loader_timeout_s}")
        if self.prefetch < 1:
            raise ValueError(f"data.prefetch must be >= 1, got {self.prefetch}")
        if self.pattern_period < 2:
            raise ValueError(f"data.pattern_period must be >= 2, got {self.pattern_period}")
        if self.dataset in ("parquet", "jsonl", "fineweb_edu") and not self.path:
            raise ValueError(
                f"data.path is required for data.dataset={self.dataset!r} (local files only, no "
                "downloads); e.g. --override data.path=/data/fineweb-edu/*.parquet"
            )


@dataclass
class DistConfig:
    mode: str = "auto"
    """auto (ddp under torchrun with WORLD_SIZE > 1, else single), single, ddp or fsdp (FSDP2)."""
    backend: str = "auto"
    """Process-group backend: auto (nccl on CUDA, gloo on CPU), nccl or gloo."""
    timeout_s: float = 1800.0
    """Process-group collective timeout."""
    ddp_bucket_mb: int = 25
    """DDP gradient bucket size in MiB (env NSA_DDP_BUCKET_MB)."""
    ddp_compress: str = "none"
    """DDP gradient compression hook: none, bf16 or fp16; needs NCCL (env NSA_DDP_COMPRESS)."""
    ddp_static_graph: bool = False
    """DDP static_graph (env NSA_DDP_STATIC_GRAPH)."""
    ddp_find_unused: bool = False
    """DDP find_unused_parameters (env NSA_DDP_FIND_UNUSED)."""
    ddp_grad_as_bucket_view: bool = True
    """DDP gradient_as_bucket_view (saves one gradient copy)."""
    fsdp_reshard_after_forward: bool = True
    """FSDP2: free gathered parameters after forward (ZeRO-3) or keep them (ZeRO-2)."""

    def __post_init__(self) -> None:
        if self.mode not in DIST_MODES:
            raise ValueError(f"dist.mode must be one of {DIST_MODES}, got {self.mode!r}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"dist.backend must be auto, nccl or gloo, got {self.backend!r}")
        if self.ddp_compress in ("0", "off", "false", ""):
            self.ddp_compress = "none"
        if self.ddp_compress not in COMPRESS:
            raise ValueError(f"dist.ddp_compress must be one of {COMPRESS}, got {self.ddp_compress!r}")
        if self.ddp_bucket_mb < 1:
            raise ValueError(f"dist.ddp_bucket_mb must be >= 1, got {self.ddp_bucket_mb}")
        if self.timeout_s <= 0:
            raise ValueError(f"dist.timeout_s must be > 0, got {self.timeout_s}")


@dataclass
class TelemetryConfig:
    heartbeat: bool = True
    """Write heartbeat_rank{R}.jsonl (per logged step and per stage change)."""
    nvtx: bool = False
    """Emit torch.cuda.nvtx ranges per stage (env NSA_NVTX); needs CUDA."""
    disable_aux_stats: bool = False
    """Skip gate statistics and route counters in heartbeats, avoiding their device sync
    (env NSA_DISABLE_AUX_STATS)."""
    tensorboard: bool = False
    """Write TensorBoard event files of the logged steps (loss, lr, tokens/s, step time, grad norm,
    memory, gates) into out_dir/tensorboard, rank 0; needs the tensorboard package (pip install -e
    '.[tensorboard]'): without it the run goes on without, and env.json's tensorboard says why."""
    tb_disable: bool = False
    """Turn the TensorBoard writer off whatever telemetry.tensorboard says (env NSA_TB_DISABLE, the
    seed runbook's switch); a no-op, and reported as one, while telemetry.tensorboard is off."""


@dataclass
class SdpaConfig:
    audit: bool = False
    """Print and record the attention backend of every branch and the SDPA kernel flags after the
    first step (env NSA_SDPA_AUDIT)."""
    flash_only: bool = False
    """Allow only the flash SDPA kernel (env NSA_SDPA_FLASH_ONLY); affects branches routed to SDPA."""
    no_flash: bool = False
    """Disable the flash SDPA kernel (env NSA_SDPA_NO_FLASH); affects branches routed to SDPA."""

    def __post_init__(self) -> None:
        if self.flash_only and self.no_flash:
            raise ValueError("sdpa.flash_only and sdpa.no_flash contradict each other; set one")


@dataclass
class CompatConfig:
    """Toggles of the seed trainer that mean nothing here; accepted, recorded and reported."""

    prefill_batched: bool = True
    """No-op (env NSA_PREFILL_BATCHED): prefill is always vectorised in this implementation."""
    sel_ranges_v2: bool = True
    """No-op (env NSA_SEL_RANGES_V2): selection has one implementation per backend here."""


@dataclass
class WatchdogConfig:
    enabled: bool = True
    timeout_s: float = 600.0
    """No progress (stage change) on a rank for this long: dump stacks, write .HALT, exit 3."""
    startup_s: float = 1800.0
    """The limit instead of timeout_s until the process reaches its first steady step: set-up
    (process group, model, checkpoint) and the steps before it, which compile, autotune the
    kernels and capture the CUDA graph, each far slower than a step. Never less than timeout_s,
    so a short timeout_s does not fire in a first step's compile."""
    poll_s: float = 1.0
    """How often the watchdog thread checks progress and a peer's .HALT."""
    grace_s: float = 5.0
    """After firing, how long to wait for every rank's stack dump before exiting."""
    term_grace_s: float = 20.0
    """After a SIGTERM (preemption), how long the run may take to finish the step in flight and
    save it; past this the process ends by SIGTERM at once (a rank blocked for a peer that is
    gone). Below the 30 s after which torchrun, Slurm (KillWait) and Kubernetes send SIGKILL."""

    def __post_init__(self) -> None:
        if self.timeout_s <= 0 or self.startup_s <= 0 or self.poll_s <= 0 or self.grace_s < 0 or self.term_grace_s < 0:
            raise ValueError("watchdog.timeout_s, watchdog.startup_s and watchdog.poll_s must be > 0, "
                             "watchdog.grace_s and watchdog.term_grace_s >= 0")


@dataclass
class FaultConfig:
    spec: str = ""
    """Fault injection for tests (env NSA_FAULT), e.g. 'stall:rank=1:step=3'. Grammar in
    nsa/train/faults.py. Empty: off."""


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    sdpa: SdpaConfig = field(default_factory=SdpaConfig)
    compat: CompatConfig = field(default_factory=CompatConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)

    def __post_init__(self) -> None:
        if self.data.tokenizer == "byte" and self.model.vocab_size < 256:
            raise ValueError(
                f"model.vocab_size={self.model.vocab_size} is too small for the byte tokenizer (256)"
            )


# --- environment toggles: the one place the trainer reads them ------------------------------

#: env var -> dotted config key. Nothing else in nsa/train reads these variables.
ENV_TOGGLES: dict[str, str] = {
    "NSA_DDP_BUCKET_MB": "dist.ddp_bucket_mb",
    "NSA_DDP_COMPRESS": "dist.ddp_compress",
    "NSA_DDP_STATIC_GRAPH": "dist.ddp_static_graph",
    "NSA_DDP_FIND_UNUSED": "dist.ddp_find_unused",
    "NSA_PREFILL_BATCHED": "compat.prefill_batched",
    "NSA_SEL_RANGES_V2": "compat.sel_ranges_v2",
    "NSA_SDPA_AUDIT": "sdpa.audit",
    "NSA_SDPA_FLASH_ONLY": "sdpa.flash_only",
    "NSA_SDPA_NO_FLASH": "sdpa.no_flash",
    "NSA_NVTX": "telemetry.nvtx",
    "NSA_OPT_FUSED": "train.fused_adamw",
    "NSA_CUDA_GRAPHS": "train.cuda_graphs",
    "NSA_DETERMINISTIC": "train.deterministic",
    "NSA_TB_DISABLE": "telemetry.tb_disable",
    "NSA_DISABLE_AUX_STATS": "telemetry.disable_aux_stats",
    "NSA_FAULT": "fault.spec",
    # the artifact contract's profile request (CONTRACT_PROFILE_STEPS), set by a harness
    contract.PROFILE_STEPS_ENV: "train.profile_steps",
}
#: the env var that names the config file (the CLI's --config)
CONFIG_ENV = "CONFIG"

#: toggles accepted for the runbook's sake that change nothing, and why
NOOP_TOGGLES: dict[str, str] = {
    "NSA_PREFILL_BATCHED": "prefill is always vectorised (no sequential prefill path exists)",
    "NSA_SEL_RANGES_V2": "selection has a single implementation per backend (no v1/v2 split)",
}
#: toggles that mean nothing while another key is off: var -> (that key, why); reported as no-ops then
NOOP_UNLESS: dict[str, tuple[str, str]] = {
    "NSA_TB_DISABLE": ("telemetry.tensorboard", "telemetry.tensorboard is off: there is no TensorBoard writer "
                                                "to turn off"),
}


@dataclass
class Resolved:
    """How the config was arrived at; recorded in env.json."""

    config_path: str
    overrides: dict[str, Any]
    env_applied: dict[str, dict[str, str]]
    """var -> {key, value} for every toggle that was set."""
    noop_toggles: dict[str, str]
    """var -> why it does nothing, for no-op toggles that were set."""
    env_seen: dict[str, str]
    """Every NSA_* and NCCL_* variable, CONFIG and every ENV_TOGGLES variable present."""

    def blame(self, message: str) -> str:
        """An error of a config value found after loading (a data path, a checkpoint, the output
        directory) as the user reads it: the config file, the message naming the key and, where the
        command line or an environment toggle set that key, that."""
        return f"{self.config_path}: {message}{_where_set(message, self.overrides, self.env_applied)}"


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = tree
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value


def _get_dotted(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _dotted_items(tree: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """('train.steps', '0') for each leaf of a nested override tree."""
    out: list[tuple[str, Any]] = []
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out += _dotted_items(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def _named_in(message: str, key: str) -> bool:
    """Whether a config error names ``key``: in full, or, for a nested section's own check (which
    says 'attn.window' of model.attn.window), without its first part."""
    parts = key.split(".")
    return key in message or (len(parts) > 2 and ".".join(parts[1:]) in message)


def _where_set(message: str, overrides: Mapping[str, Any], applied: Mapping[str, dict[str, str]]) -> str:
    """' (set by ...)' for each key of a config error's message that the command line or an
    environment toggle set: else the error names only the config file, whose value was replaced."""
    by_env = {entry["key"]: var for var, entry in applied.items()}
    notes = [f"set by environment variable {var}={applied[var]['value']!r}"
             for key, var in by_env.items() if _named_in(message, key)]
    notes += [f"set on the command line: {key}={value}" for key, value in _dotted_items(overrides)
              if key not in by_env and _named_in(message, key)]
    return "".join(f" ({note})" for note in notes)


def choose_config(cli_config: str | None, env: Mapping[str, str]) -> str:
    """--config, else $CONFIG, else the m7c_125m preset. Both given and different: an error, and
    so is an empty --config (``--config "$CFG"`` with CFG unset), which would otherwise silently mean
    m7c_125m."""
    if cli_config is not None and not cli_config.strip():
        raise ConfigError("--config is empty: expected a preset name or a YAML path (leave --config out "
                          "for $CONFIG, else the m7c_125m preset)")
    env_config = env.get(CONFIG_ENV) or None
    if cli_config and env_config and cli_config != env_config:
        raise disagree(f"--config {cli_config!r}", f"{CONFIG_ENV}={env_config!r}")
    return cli_config or env_config or "m7c_125m"


def load_run_config(
    config: str | None = None,
    overrides: list[str] | str | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[RunConfig, Resolved]:
    """Build the RunConfig from a preset name or YAML path, dotted overrides and the environment.
    Errors are ConfigError naming the file, the dotted key and, for toggles, the variable."""
    env = os.environ if env is None else env
    chosen = choose_config(config, env)
    try:
        path = resolve_config_path(chosen)
    except ConfigError as exc:  # from $CONFIG: a run launched without --config names no config of its own
        if config or not env.get(CONFIG_ENV):
            raise
        raise ConfigError(f"{exc} (set by environment variable {CONFIG_ENV}={chosen!r})") from None
    data = read_yaml(path, sections=[f.name for f in dataclasses.fields(RunConfig)])
    extra = parse_overrides(overrides)
    env_tree: dict[str, Any] = {}
    applied, noops = {}, {}
    for var, key in ENV_TOGGLES.items():
        if var in env:
            _set_dotted(env_tree, key, env[var])
            applied[var] = {"key": key, "value": env[var]}
            if var in NOOP_TOGGLES:
                noops[var] = NOOP_TOGGLES[var]
    try:
        cfg = from_dict(RunConfig, merge(merge(data, extra), env_tree))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}{_where_set(str(exc), extra, applied)}") from None
    for var, (key, why) in NOOP_UNLESS.items():
        if var in applied and not _get_dotted(cfg, key):
            noops[var] = why
    seen = {k: v for k, v in sorted(env.items())
            if k.startswith(("NSA_", "NCCL_")) or k == CONFIG_ENV or k in ENV_TOGGLES}
    return cfg, Resolved(str(path), extra, applied, noops, seen)


def flag_overrides(overrides: list[str], flags: dict[str, object]) -> list[str]:
    """The overrides of the flags given (--out-dir, --steps: train.out_dir, train.steps), applied
    last. A flag beside an override of its key to another value is an error naming both: the flag
    won without a word (`--steps 3 train.steps=-1` ran 3 steps)."""
    typed = parse_overrides(overrides).get("train", {})
    out = []
    for key, value in flags.items():
        if value is None:
            continue
        if key in typed and typed[key] != str(value):
            flag = "--" + key.replace("_", "-")
            raise disagree(f"{flag} {value}", f"the override train.{key}={typed[key]}")
        out.append(f"train.{key}={value}")
    return out


def check_run_config(config: str | None, steps: int | None, overrides: Mapping[str, str],
                     env: Mapping[str, str]) -> str | None:
    """The one-line error a run given ``--config config --steps steps --override 'k=v ...'`` in the
    environment ``env`` would stop with while loading its config, or None where it would take it
    (``--check-config``, nsa/train/keys.py). Nothing is run or written."""
    words = [" ".join(f"{k}={v}" for k, v in overrides.items())] if overrides else []
    try:
        words += flag_overrides(words, {"steps": steps})
        load_run_config(config, words, env)
    except ConfigError as exc:
        return str(exc)
    return None


def config_dict(cfg: RunConfig) -> dict[str, Any]:
    return to_dict(cfg)


def config_keys() -> set[str]:
    """The dotted keys an override may set ('train.seq_len', 'model.attn.window', ...)."""
    return field_paths(RunConfig)


def out_dir(cfg: RunConfig) -> Path:
    return Path(cfg.train.out_dir)
