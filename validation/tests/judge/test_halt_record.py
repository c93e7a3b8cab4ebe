"""The .HALT file as the harness reads it: a trainer's JSON record, an operator's free text,
and a record cut short (a foreign trainer that writes it in place, read or killed mid-write),
which must not pass for an operator's stop and hide a stall."""
from __future__ import annotations

import json

from validation.contract.files import read_halt
from validation.judge.record import Status
from validation.judge.verdict import Outcome, verdict


def _write(tmp_path, text: str):
    (tmp_path / ".HALT").write_text(text)
    return read_halt(tmp_path)


def test_a_whole_watchdog_record(tmp_path):
    halt = _write(tmp_path, json.dumps({"source": "watchdog", "step": 7, "stage": "backward"}))
    assert (halt.source, halt.step, halt.torn) == ("watchdog", 7, False)
    assert verdict(Outcome("train", halt=halt), []) == (
        Status.FAIL, "watchdog wrote .HALT: no rank made progress")


def test_a_watchdog_record_cut_short_is_still_the_watchdog(tmp_path):
    halt = _write(tmp_path, '{"source": "watchdog", "step": 12, "stage": "backw')
    assert (halt.source, halt.step, halt.torn) == ("watchdog", 12, True)
    status, reason = verdict(Outcome("train", halt=halt), [])
    assert status == Status.FAIL and reason == "watchdog wrote .HALT: no rank made progress (its record cut short)"


def test_a_nonfinite_record_cut_short(tmp_path):
    halt = _write(tmp_path, '{"source": "nonfinite", "step": 3, "losses": [1.0, NaN')
    status, reason = verdict(Outcome("train", halt=halt), [])
    assert reason.startswith("non-finite loss at step 3") and reason.endswith("(its record cut short)")


def test_a_record_cut_before_its_source_is_not_an_operator_stop(tmp_path):
    halt = _write(tmp_path, '{"ste')
    assert halt.torn and halt.source is None and halt.step is None
    status, reason = verdict(Outcome("train", halt=halt), [])
    assert status == Status.FAIL and "cut short" in reason and "operator" not in reason


def test_an_operators_free_text_and_empty_file(tmp_path):
    halt = _write(tmp_path, "stopping for maintenance\n")
    assert (halt.source, halt.torn, halt.text) == (None, False, "stopping for maintenance")
    assert verdict(Outcome("train", halt=halt), [])[1] == "stopped by a .HALT (stopping for maintenance)"
    assert verdict(Outcome("train", halt=_write(tmp_path, "")), [])[1] == "stopped by a .HALT (an empty file)"


def test_a_nonfinite_record_in_strict_json_reads_as_the_numbers_it_names(tmp_path):
    """The trainer wrote "losses": [NaN] (Python's json default), which jq, JSON.parse and Go refuse;
    it now writes the contract's strings ("nan", "inf", "-inf"). Both spellings read as the same
    numbers, and the verdict says the same of each."""
    strict = _write(tmp_path, '{"source": "nonfinite", "step": 3, "losses": [5.25, "nan", "-inf"], "grad_norm": "inf"}')
    reason = verdict(Outcome("train", halt=strict), [])[1]
    assert reason == "non-finite loss at step 3: loss per rank [5.25, nan, -inf], grad_norm inf (trainer .HALT)"
    bare = _write(tmp_path, '{"source": "nonfinite", "step": 3, "losses": [5.25, NaN, -Infinity], "grad_norm": Infinity}')
    assert verdict(Outcome("train", halt=bare), [])[1] == reason
    odd = _write(tmp_path, '{"source": "nonfinite", "step": 3, "losses": [5.25, "big"], "grad_norm": true}')
    assert (odd.losses, odd.grad_norm) == ([5.25, None], None)  # no number: nothing made up
