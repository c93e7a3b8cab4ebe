"""``nsa-validate check-artifacts DIR [--adapter NAME]``: a run directory against the artifact
contract (docs/artifact_contract.md), for trainer authors before their first acceptance run.

Besides each file's form it holds the ranks to what the contract asks of their heartbeats as an
acceptance run does: a rank of several whose heartbeats stop before the run's last step (the last
training.csv logs, where the steps asked for are not known) while the run went on left early or
trained on without writing them (validation/judge/short_ranks.py), and so does not hold to it.

With an adapter, DIR is the trainer's own output directory: the adapter converts it into a
temporary directory (DIR is never written), and that is checked, with what the acceptance run
gives the adapter: the world size, and for an adapter that derives tokens/s from it
(``Adapter.takes_tokens_per_step``) one rank's tokens per step, which a runbook gives as
``trainer.tokens_per_step`` and the run multiplies by the world size (validation/launch/foreign.py
``tokens_per_step``). Without them the folder is judged as the run of a runbook that gives none.
Each file an adapter wrote is said by where it came from (the adapter's ``Converted``), and its
env.json key by key: a file or key the adapter derived, or the harness gave it, must not read as
the trainer's.
Exit 0 when the contract holds, 1 when a required file or field is missing or malformed, 2 for a
DIR that is not a directory.
"""
from __future__ import annotations

import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from nsa.contract import ENV_JSON
from validation.contract import check as contract
from validation.contract.adapters import ADAPTERS
from validation.contract.adapters.base import BY_HAND, Converted, FileOrigin, KeyOrigin, Origin, RunFacts
from validation.contract.files import BareNonfinite, bare_nonfinite
from validation.judge.record import Beat
from validation.judge.short_ranks import short_ranks

EXIT_OK, EXIT_BROKEN, EXIT_USAGE = 0, 1, 2


def check(directory: Path, adapter: str = "native", world_size: int | None = None, out: TextIO | None = None,
          costs: contract.Costs | None = None, tokens_per_step: int | None = None) -> int:
    """``costs``: per optional field, the metrics its absence leaves UNMEASURED (the judge's
    catalogue, ``validation.judge.metrics.costs()``), named beside the field; without it the
    check says that the metrics reading the field are UNMEASURED. ``tokens_per_step``: one rank's
    tokens per optimizer step (a runbook's ``trainer.tokens_per_step``), for an adapter that takes it."""
    out = out or sys.stdout  # looked up now, not when the module was imported
    if not directory.is_dir():
        print(f"nsa-validate check-artifacts: error: {directory} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    code = _report(_read(directory, adapter, world_size, costs, tokens_per_step), directory, adapter, out,
                   _given(directory, adapter, world_size, tokens_per_step))
    if code == EXIT_BROKEN:  # a directory of another format than the one named: say which reads it
        fits = [name for name in sorted(ADAPTERS) if name != adapter and ADAPTERS[name].in_format(directory)
                and _read(directory, name, world_size, costs, tokens_per_step).found.ok]
        for name in fits:
            print(f"hint: {directory} holds to the contract "
                  + ("as it is: check it without --adapter" if not ADAPTERS[name].converts
                     else f"through --adapter {name}"), file=out)
    return code


def world_of(directory: Path, world_size: int | None) -> int:
    """The world size an adapter is given for a trainer's own output directory: ``world_size``,
    else one rank per heartbeat file it holds, else 1."""
    return world_size or max(len(list(directory.glob("heartbeat_rank*.jsonl"))), 1)


@dataclass(frozen=True)
class _Checked:
    """A directory's contract read, and what is said beside its items."""

    found: contract.ContractRead
    bare: list[BareNonfinite]
    """Its JSON files' bare NaN / Infinity values (a warning each)."""
    converted: Converted | None = None
    """Where each file an adapter wrote, and each key of its env.json, came from; None for the
    contract itself, whose every file is the trainer's own."""


def _read(directory: Path, adapter: str, world_size: int | None, costs: contract.Costs | None,
          tokens_per_step: int | None = None) -> _Checked:
    """The contract read of ``directory``, through ``adapter`` where it converts."""
    if not ADAPTERS[adapter].converts:  # the contract itself: read in place
        found = _read_ended(directory, costs, world_size or 1)
        checked = _Checked(found, bare_nonfinite(directory))
    else:
        with tempfile.TemporaryDirectory(prefix="nsa-check-") as tmp:
            world = world_of(directory, world_size)
            # the global tokens per step, as the acceptance run gives them: one rank's times the world size
            tokens = tokens_per_step * world if tokens_per_step and ADAPTERS[adapter].takes_tokens_per_step else None
            converted = ADAPTERS[adapter].convert(directory, Path(tmp),
                                                  RunFacts(world, BY_HAND, tokens_per_step=tokens))
            found = _read_ended(Path(tmp), costs, 1)
            checked = _Checked(found, bare_nonfinite(Path(tmp)), converted)
    found.items += contract.silent_ranks(found) + _short_ranks(found)
    return checked


def _short_ranks(found: contract.ContractRead) -> list[contract.Item]:
    """A malformed item per rank whose heartbeats stop before the run's last step (``short_ranks``,
    the run's steps taken as the last that training.csv logs)."""
    world, csv = found.world_size, found.csv
    if world is None or world < 2 or csv is None or "step" not in csv or csv["step"].dropna().empty:
        return []
    logged = int(csv["step"].dropna().max())
    beats = {r: Beat.of(recs) for r, recs in found.heartbeats.items() if recs}
    return [contract.Item(contract.heartbeat_name(s.rank), contract.Presence.MALFORMED, s.text(logged))
            for s in short_ranks(beats, world, logged, logged)]


def _read_ended(directory: Path, costs: contract.Costs | None, launched: int) -> contract.ContractRead:
    """The contract files of a run that has ended (one checked by hand): an entry with no line end
    is then malformed, as the acceptance run of a trainer that exits 0 finds it (a trainer killed
    mid-write leaves one too)."""
    found = contract.read(directory, costs, launched=launched)
    found.items += [contract.Item(cut.path.name, contract.Presence.MALFORMED,
                                  f"{cut.why()}; an acceptance run whose trainer exits 0 is an ERROR for it")
                    for cut in contract.unended(found)]
    return found


def _given(directory: Path, adapter: str, world_size: int | None, tokens_per_step: int | None) -> str:
    """What the adapter was given, as the acceptance run gives it: 'world size 2, 512 tokens per step
    (256 a rank)'; '' for the contract itself."""
    if not ADAPTERS[adapter].converts:
        return ""
    world = world_of(directory, world_size)
    text = f"world size {world}"
    if ADAPTERS[adapter].takes_tokens_per_step:
        text += (f", {tokens_per_step * world} tokens per step ({tokens_per_step} a rank)" if tokens_per_step
                 else ", no tokens per step (--tokens-per-step): tokens/s UNMEASURED, as in a run whose runbook "
                      "gives no trainer.tokens_per_step")
    return text


def _report(checked: _Checked, directory: Path, adapter: str, out: TextIO, given: str = "") -> int:
    found = checked.found
    print(f"{directory} against the artifact contract"
          + (f" (through adapter {adapter})" if adapter != "native" else "") + ":", file=out)
    if given:
        print(f"  given the adapter: {given}", file=out)
    for line in _item_lines(checked, adapter):
        print("  " + line, file=out)
    for b in checked.bare:  # read as the number it names: a warning, not a failure of the contract check
        print(f"  warning: {b.text()}", file=out)
    for name, why in contract.adapter_unreadable(found.env).items():  # its other files gave the rows: a warning
        print(f"  warning: {name}: {why}", file=out)
    bad = [i for i in found.items if i.problem]
    if bad:
        print(f"NOT OK: {len(bad)} required item(s) missing or malformed", file=out)
        return EXIT_BROKEN
    print("OK: every required file is present and well-formed (the run they record is judged by an acceptance "
          "run: a stall, the losses, the gates)", file=out)
    return EXIT_OK


def _item_lines(checked: _Checked, adapter: str) -> list[str]:
    """A line per item; of the files an adapter wrote, each by where it came from, and env.json's
    keys each by where it came from."""
    found, converted = checked.found, checked.converted
    if converted is None:
        return [item.line() for item in found.items]
    return [line for item in found.items for line in _adapted(item, found.env, converted, adapter)]


def _adapted(item: contract.Item, env: dict[str, Any] | None, converted: Converted, adapter: str) -> list[str]:
    """The lines of an item of the files an adapter wrote: a file it built is no file the trainer
    wrote, though present, so that its origin's word ('derived') stands for 'present', with what it
    came from. Its env.json is the trainer's only key by key: the file's line is followed by one per
    key, and a key inside it that an item names (adapter.restarts) takes its origin's word. An item
    missing or malformed is said as the contract's check says it."""
    if item.presence != contract.Presence.PRESENT:
        return [item.line()]
    if item.file != ENV_JSON:
        return [_said(item, converted.file(item.file), adapter)]
    if item.field is not None:
        return [_said(item, converted.origin(item.field), adapter)]
    return _env_key_lines(item, env or {}, converted, adapter)


def _said(item: contract.Item, origin: KeyOrigin | FileOrigin, adapter: str) -> str:
    """The item's line with its origin's word for 'present' and what it came from after its detail."""
    return dataclasses.replace(item, detail=f"{item.detail} ({origin.text(adapter)})").line(origin.origin)


def _env_key_lines(file_item: contract.Item, env: dict[str, Any], converted: Converted, adapter: str) -> list[str]:
    """env.json's line, by where the file came from and saying how many of its keys are the
    trainer's own, then each key's origin. Keys of no value say nothing (the contract's own line
    names one it misses), and the adapter's own record (what it read) is neither a fact of the run
    nor a key of the trainer's."""
    origins = {key: converted.origin(key) for key, value in env.items() if value is not None}
    origins = {key: origin for key, origin in origins.items() if origin.origin != Origin.BOOKKEEPING}
    own = sum(origin.origin == Origin.TRAINER for origin in origins.values())
    written = converted.file(ENV_JSON)
    head = dataclasses.replace(file_item, detail=f"{written.text(adapter)}; {own} of the {len(origins)} keys below "
                                                 "are the trainer's own")
    return [head.line(written.origin)] + [contract.Item(ENV_JSON, contract.Presence.PRESENT, origin.text(adapter),
                                                        False, key).line(origin.origin)
                                          for key, origin in origins.items()]
