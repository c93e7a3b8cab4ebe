"""JSON that every reader takes: the trainer's JSON files (env.json, heartbeats, .HALT,
profile.json) hold no bare NaN or Infinity, which Python's json module writes by default and
jq, JavaScript's JSON.parse and Go's encoding/json refuse. A non-finite float is written as the
artifact contract's string for it (nsa/contract.py JSON_NONFINITE: "nan", "inf", "-inf")."""
from __future__ import annotations

import json
import math
from typing import Any

from .. import contract

_NAN, _INF, _NEG_INF = contract.JSON_NONFINITE


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with every non-finite float in it spelled as a string;
    ``allow_nan=False`` so that one left anywhere (a ``default`` that returns one) is an error,
    not a file a strict reader refuses."""
    return json.dumps(_finite(obj), allow_nan=False, **kwargs)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return _NAN if math.isnan(obj) else _INF if obj > 0 else _NEG_INF
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj
