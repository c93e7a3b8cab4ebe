"""The CPU snippets of docs/guides/nsa-in-your-model.md run as written and print what it says."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "nsa-in-your-model.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", GUIDE.read_text(), re.S)


def test_the_oracle_snippet_matches_the_layer_with_the_selection_and_window_at_work():
    [snippet] = [b for b in _blocks() if "reference_nsa" in b]
    from nsa.attention import NSAAttention, NSAConfig

    scope = {"torch": torch, "NSAAttention": NSAAttention, "NSAConfig": NSAConfig}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(snippet, str(GUIDE), "exec"), scope)
    assert float(re.search(r"tensor\(([-+.\de]+)", out.getvalue()).group(1)) < 1e-12
    cfg, T = scope["cfg"], scope["x"].shape[1]
    assert T > cfg.window and -(-T // cfg.sel_block) > cfg.n_selected  # both branches leave keys out
