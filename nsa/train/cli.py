"""Command line of the trainer: ``python -m nsa.train`` (alone or under torchrun)."""
from __future__ import annotations

import argparse
import io
import os
import signal
import sys
import textwrap

from .. import contract
from ..attention import BackendUnavailable
from ..config import ConfigError, list_presets
from .checkpoint import CheckpointError
from .config import ENV_TOGGLES, NOOP_TOGGLES, NOOP_UNLESS, flag_overrides, load_run_config
from .data import DataError
from .interrupt import EXIT_INTERRUPTED, EXIT_TERMINATED
from .loop import Trainer
from .watchdog import end_by_default

EXIT_INPUT = contract.EXIT_INPUT
"""Bad config, data, checkpoint or backend request: a one-line error, no traceback."""

ENV_HELP = "environment toggles (each overrides its config key and is recorded in env.json):\n" + "\n".join(
    f"  {var:<22} -> {key}" + ("  [no-op here]" if var in NOOP_TOGGLES else "")
    + (f"  [no-op unless {NOOP_UNLESS[var][0]}]" if var in NOOP_UNLESS else "")
    for var, key in ENV_TOGGLES.items()
) + "\n  CONFIG                 -> the config file, when --config is not given"

EXIT_HELP = textwrap.fill("exit status (nsa/contract.py): " + ", ".join(
    f"{code} {meaning}" for code, meaning in contract.EXIT_MEANING.items()) + ".", width=96) + """
Out of memory (1) also writes oom_rank*.txt; a write the disk refuses (1: full, over a quota)
ends a run of one process with one line naming the file and the OS's reason, the last checkpoint
left whole; a watchdog stall (3) leaves stack dumps in stackdump_rank*.txt; the first Ctrl-C
(130) stops after the step in flight and saves a checkpoint that train.resume=auto continues, a
second one stops at once. SIGTERM (a preemption:
Slurm's scancel, Kubernetes, torchrun passing either on) stops after the step in flight too,
saves a checkpoint and ends the process by SIGTERM (143 in a shell, signal 15 to torchrun);
one during set-up (before its first step starts) ends it at once, and a run that has not stopped
watchdog.term_grace_s (20 s) after the first SIGTERM ends by SIGTERM at once, the last checkpoint
saved being the one to resume from (SIGTERM is taken while the watchdog is enabled; otherwise it
ends the run at once). Under torchrun these are the per-rank
codes in torchrun's failure summary; torchrun itself exits 1 when any rank fails. SIGINT or
SIGTERM to torchrun reaches every rank, which then stops after the same step.
Distributed runs are detected from torchrun's RANK / WORLD_SIZE / LOCAL_RANK only."""


def run(config: str | None, overrides: list[str], env=None) -> int:
    """Load the config, build the trainer, train. Returns the exit status."""
    env = os.environ if env is None else env
    rank = env.get("RANK", "0")
    resolved = None
    try:
        cfg, resolved = load_run_config(config, overrides, env)
        trainer = Trainer(cfg, resolved)
    except (ConfigError, DataError, CheckpointError, BackendUnavailable) as exc:
        # a value found wrong while setting up (a path, a device, a backend): named with the config file
        print(f"[rank {rank}] error: {exc if resolved is None else resolved.blame(str(exc))}", file=sys.stderr,
              flush=True)
        return EXIT_INPUT
    except OSError as exc:  # the machine (a full disk) while the run's first files are written: its reason
        print(f"[rank {rank}] error while setting up: {exc}", file=sys.stderr, flush=True)
        return contract.EXIT_ERROR
    except KeyboardInterrupt:
        print(f"[rank {rank}] interrupted (Ctrl-C) before training started", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    try:
        return trainer.train()
    except (DataError, BackendUnavailable) as exc:
        print(f"[rank {rank}] error {trainer.where()}: {exc}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    except KeyboardInterrupt:  # the second Ctrl-C: no checkpoint of the step in flight
        print(f"[rank {rank}] interrupted (Ctrl-C twice) {trainer.where()}; the last checkpoint "
              "saved is the one to resume from", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as exc:
        if trainer.info.world_size < 2:
            if isinstance(exc, (CheckpointError, OSError)):
                # the machine, not the code (a full disk, a quota, a file too large): a traceback
                # would bury the one line that matters, the file and the OS's reason
                print(f"[rank {rank}] error {trainer.where()}: {exc}", file=sys.stderr, flush=True)
                return contract.EXIT_ERROR
            raise  # no peer to wait for: the traceback as usual, on the way out
        # The traceback now, and no wait for the other ranks: over NCCL they may be blocked in a
        # collective this rank will never join, and destroying the process group (a collective
        # there) would hang this rank, its watchdog already closed, until a peer's watchdog fired
        # and the stall read as the peer's (tests/faults/test_nccl_faults.py checks it). Printed
        # by sys.excepthook, as an uncaught exception would be: under torch.distributed that hook
        # prefixes each line with [rankN]:, which is how a reader of the log (the harness) tells
        # whose traceback it is. The process ends with os._exit once its files are closed;
        # torchrun then ends the others.
        sys.excepthook(*sys.exc_info())
        trainer.failed = True
        trainer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(contract.EXIT_ERROR)
    finally:
        trainer.close()


def config_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """A front end's parser: --config, and the environment and exit statuses in its help."""
    p = argparse.ArgumentParser(prog=prog, description=description, epilog=ENV_HELP + "\n\n" + EXIT_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None,
                   help=f"preset name ({', '.join(list_presets())}) or YAML path; default $CONFIG, else m7c_125m")
    return p


def build_parser() -> argparse.ArgumentParser:
    p = config_parser("python -m nsa.train",
                      "Train an NSA model from a config (single process, or DDP / FSDP2 under torchrun).")
    p.add_argument("--override", action="append", default=[], metavar="'KEY=VALUE ...'",
                   help="dotted config overrides, space separated, repeatable, e.g. "
                        "'train.seq_len=512 model.n_layers=2'")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted config overrides as words of their own (train.seq_len=512 model.n_layers=2), "
                        "beside those of --override; a key given twice with two values is refused")
    p.add_argument("--out-dir", default=None, help="output directory (train.out_dir)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (train.steps)")
    p.add_argument(contract.LIST_KEYS_FLAG, action="store_true",
                   help="print the config keys (a JSON list of dotted names) and exit; fast, no torch import")
    p.add_argument(contract.CHECK_CONFIG_FLAG, action="store_true",
                   help="read a JSON list of runs ({config, steps, overrides, env}) from stdin, print a JSON list of "
                        "the error each would stop with while loading its config (null: none) and exit; runs "
                        "nothing, no torch import")
    return p


def whole_lines() -> None:
    """Each line printed to stdout and stderr leaves in one write. Under PYTHONUNBUFFERED (set
    by the harness and common under torchrun) print() writes a line's text and its newline apart,
    and a line of another rank or of torchrun's agent, sharing the stream, could land between
    them: on rank 0's line, which a reader matching whole lines then misses."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True, write_through=False)


def main(argv: list[str] | None = None) -> int:
    whole_lines()
    # intermixed: override words may stand before and after options (`train.seq_len=64 --steps 3 ...`)
    args = build_parser().parse_intermixed_args(argv)
    if args.list_keys:
        from .keys import main as list_keys

        return list_keys()
    if args.check_config:
        from .keys import check_main

        return check_main()
    overrides = [*args.override, *args.overrides]
    try:
        overrides += flag_overrides(overrides, {"out_dir": args.out_dir, "steps": args.steps})
    except ConfigError as exc:
        print(f"[rank {os.environ.get('RANK', '0')}] error: {exc}", file=sys.stderr, flush=True)
        return EXIT_INPUT
    status = run(args.config, overrides)
    if status == EXIT_TERMINATED:
        # ended by SIGTERM itself, as the sender expects: torchrun reports the rank killed by
        # SIGTERM (a stop it asked for), a shell 143, whether or not the run got to stop cleanly
        sys.stdout.flush()
        sys.stderr.flush()
        end_by_default(signal.SIGTERM)
    return status
