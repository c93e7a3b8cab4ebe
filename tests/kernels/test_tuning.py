"""Kernel variants travel as arguments (nsa.kernels.tuning): a tuning survives the string an
nsa:: custom op carries, bad fields are named, and a band tile asked for is the one launched."""
from __future__ import annotations

import pytest

from nsa.kernels.tuning import BAND, SELECTION, TOPK, BandTiles, SelectionTuning, TopkTuning


@pytest.mark.parametrize("tuning", [SELECTION, SelectionTuning(tt=2, dq_keep="ds", tt_nb=3.5, tma=False),
                                    TOPK, TopkTuning(rows=64, score_budget=1), BAND,
                                    BandTiles(fwd=(64, 32, 4, 2), dkv=(32, 128, 8, 3))])
def test_a_tuning_survives_its_op_argument(tuning):
    arg = tuning.as_arg()
    assert type(tuning).from_arg(arg) == tuning
    assert (arg == "") == (tuning == type(tuning)()), "only the fields that differ from the defaults travel"


def test_bad_tunings_are_refused_with_the_field_named():
    with pytest.raises(ValueError, match="no field 'tx'"):
        SelectionTuning.from_arg("tx=3")
    with pytest.raises(ValueError, match=r"SelectionTuning.dq_keep is 'dS'"):
        SelectionTuning(dq_keep="dS")
    with pytest.raises(ValueError, match=r"SelectionTuning.qc is 0; expected > 0"):
        SelectionTuning(qc=0)
    with pytest.raises(ValueError, match=r"TopkTuning.rows is -1"):
        TopkTuning(rows=-1)
    with pytest.raises(ValueError, match=r"TopkTuning.chunk_blocks is 12; expected a power of two"):
        TopkTuning(chunk_blocks=12)
    with pytest.raises(ValueError, match=r"TopkTuning.select_warps is 3; expected 0 or a power of two"):
        TopkTuning(select_warps=3)
    with pytest.raises(ValueError, match=r"BandTiles.fwd is \(64, 32\)"):
        BandTiles(fwd=(64, 32))
    with pytest.raises(ValueError, match=r"SelectionTuning.tma: 'yes' is no bool"):
        SelectionTuning.from_arg("tma=yes")
    with pytest.raises(ValueError, match=r"SelectionTuning.kept_tokens: 'x' is no int \(in 'tt=2,kept_tokens=x'\)"):
        SelectionTuning.from_arg("tt=2,kept_tokens=x")


def test_band_tiles_asked_for_are_launched():
    """A BandTiles field replaces that kernel's launch from the table, the float32 rule and the
    interpreter's alike; the others keep theirs."""
    from nsa.kernels import band_attention

    for interpret, wide in ((False, False), (False, True), (True, False)):
        table = band_attention._configs(64, interpret, False, wide)
        got = band_attention._configs(64, interpret, False, wide, BandTiles(dq=(16, 32, 2, 1)))
        assert got[1] == dict(BM=16, BN=32, num_warps=2, num_stages=1)
        assert (got[0], got[2]) == (table[0], table[2])
