"""The trainer's JSON files are strict JSON: no bare NaN / Infinity (nsa/train/strict_json.py)."""
from __future__ import annotations

import json
import math

import pytest

from nsa import contract
from nsa.train import strict_json


def test_non_finite_floats_are_the_contracts_strings_at_any_depth():
    record = {"losses": [1.5, float("nan")], "grad_norm": float("inf"), "nested": {"low": (float("-inf"), 2)},
              "ok": 0.25, "n": 3, "none": None}
    text = strict_json.dumps(record)
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"losses": [1.5, "nan"], "grad_norm": "inf", "nested": {"low": ["-inf", 2]},
                                "ok": 0.25, "n": 3, "none": None}
    nan, inf, neg_inf = (float(s) for s in contract.JSON_NONFINITE)  # what a reader's float() makes of them
    assert math.isnan(nan) and (inf, neg_inf) == (float("inf"), float("-inf"))


def test_a_non_finite_value_that_comes_through_default_is_refused_not_written():
    class Odd:
        pass
    assert strict_json.dumps({"x": Odd()}, default=lambda o: "odd") == '{"x": "odd"}'
    with pytest.raises(ValueError):
        strict_json.dumps({"x": Odd()}, default=lambda o: float("nan"))
