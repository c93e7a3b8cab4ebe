"""Launch parameters and kernel variants of the Triton kernels, as values handed down to them.

Each kernel family has a frozen dataclass whose defaults are the settings measured best (the
comments say where). A benchmark sweep or a test that wants another variant passes one
(``SelectionTuning(tt=2)``) through the public function's ``tuning`` argument; no module state
changes, so two calls with different tunings can run side by side. Through an nsa:: custom op a
tuning travels as a short string (``as_arg``: the fields that differ from the defaults, '' for
none), a constant to torch.compile, and is read back once per distinct string (``from_arg``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields

Tile = tuple[int, int, int, int]
"""(BM, BN, num_warps, num_stages) of a band kernel."""


class _Tuning:
    """as_arg / from_arg for a frozen dataclass of ints, floats, bools, strs and tiles. The
    string is made once, when the tuning is (``_set_arg`` from each __post_init__): a call then
    reads an attribute, in eager mode and in a torch.compile trace alike."""

    def as_arg(self) -> str:
        return self._arg

    def _set_arg(self) -> None:
        changed = (f for f in fields(self) if getattr(self, f.name) != f.default)  # every field has a default
        object.__setattr__(self, "_arg", ",".join(f"{f.name}={_text(getattr(self, f.name))}" for f in changed))

    @classmethod
    def from_arg(cls, arg: str):
        return _from_arg(cls, arg)

    def _check_positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                raise ValueError(f"{type(self).__name__}.{name} is {getattr(self, name)!r}; expected > 0")


def _text(value) -> str:
    return ":".join(map(str, value)) if isinstance(value, tuple) else str(value)


@functools.cache
def _from_arg(cls, arg: str):
    types = {f.name: f.type for f in fields(cls)}
    values = {}
    for item in filter(None, arg.split(",")):
        name, _, text = item.partition("=")
        if name not in types:
            raise ValueError(f"{cls.__name__}: no field {name!r} (in {arg!r}); fields: {', '.join(types)}")
        try:
            values[name] = _value(types[name], text)
        except ValueError:
            raise ValueError(f"{cls.__name__}.{name}: {text!r} is no {types[name]} (in {arg!r})") from None
    return cls(**values)


def _value(kind: str, text: str):
    """``text`` read as a field of type ``kind`` (the annotation's string)."""
    if kind == "bool":
        if text not in ("True", "False"):
            raise ValueError(text)
        return text == "True"
    if kind.startswith("Tile"):
        return None if text == "None" else tuple(int(x) for x in text.split(":"))
    return {"int": int, "float": float, "str": str}[kind](text)


@dataclass(frozen=True)
class SelectionTuning(_Tuning):
    """The selected branch (nsa.kernels.selection, selection_blocks) on CUDA; the defaults are
    the fastest of `python bench/bench_nsa.py --sweep` at the benchmark and m7c shapes:

    * forward and dq kernels: fwd_warps, fwd_stages; the key-block-major forward's query rows a
      step, blocks_rows; K/V blocks through TMA descriptors at one token a tile (tma; see
      selection._tma) with tma_stages pipeline stages;
    * token tiles of the token-major forward / dq (selection._tokens_per_tile): tt > 0 forces TT,
      else TT = tt_rows // next_pow2(G), at most tt_max, where the keys hold at most tt_nb * n
      blocks, else 1;
    * dk/dv pass: qc tokens per work item (qc_interpret on the CPU interpreter, where popular
      blocks are split at small sizes too); query rows a step times the padded head dim,
      dkv_cells (so that the two [l', K] accumulators and a step's tiles fit the registers of
      dkv_warps: 64 rows at K=128, 128 at K=64); dkv_warps, dkv_stages;
    * dq from what the dk/dv pass keeps at one token a tile (dq_from_pass; selection._dq_from_pass),
      what it keeps (dq_keep: 'dq' partials, 'ds' tiles, 'auto' selection._dq_source's rule),
      kept_budget bytes and kept_tokens tokens of the batch at a time (longer inputs a chunk of
      query tokens at a time: the kept tiles of the layer being differentiated add to a model's
      peak, which every layer's activations already make; whole for 128k tokens of m7c_125m they
      were 3.2 GB of its compiled step's peak, then above the dense model's, `bench/peak_holders.py`);
    * partials_budget: bytes of the key-block-major forward's partial outputs held at once
      (selection_blocks; longer inputs a chunk of query tokens at a time); the kernel combining a
      row's partials: combine_values partial values in flight a program (its rows, n * K each),
      on combine_warps."""
    fwd_warps: int = 4
    fwd_stages: int = 2
    blocks_rows: int = 64
    tma: bool = True
    tma_stages: int = 3
    tt: int = 0
    tt_rows: int = 64
    tt_max: int = 8
    tt_nb: float = 2.0
    qc: int = 1024
    qc_interpret: int = 64
    dkv_cells: int = 8192
    dkv_warps: int = 4
    dkv_stages: int = 2
    dq_from_pass: bool = True
    dq_keep: str = "auto"
    kept_budget: int = 16 << 30
    kept_tokens: int = 65536
    partials_budget: int = 4 << 30
    combine_values: int = 8192
    combine_warps: int = 4

    def __post_init__(self):
        if self.dq_keep not in ("auto", "dq", "ds"):
            raise ValueError(f"SelectionTuning.dq_keep is {self.dq_keep!r}; expected 'auto', 'dq' or 'ds'")
        if self.tt < 0:
            raise ValueError(f"SelectionTuning.tt is {self.tt}; expected 0 (the rule) or a forced tile > 0")
        self._check_positive("fwd_warps", "fwd_stages", "blocks_rows", "tma_stages", "tt_rows", "tt_max", "tt_nb",
                             "qc", "qc_interpret", "dkv_cells", "dkv_warps", "dkv_stages", "kept_budget",
                             "kept_tokens", "partials_budget", "combine_values", "combine_warps")
        self._set_arg()


@dataclass(frozen=True)
class TopkTuning(_Tuning):
    """Top-n selection (nsa.kernels.topk) on CUDA: the score kernel's query rows (tokens x padded
    group) a program, warps and pipeline stages (the fastest of `python bench/bench_nsa.py
    --sweep` at 2k to 64k and m7c_125m); rows_interpret, its rows on the CPU
    interpreter; score_budget bytes of float32 block scores held at once (longer inputs are scored
    a query chunk at a time); select_candidates, the scores a row the select kernel searches over
    when a floor leaves that few (topk._select_kernel); chunk_blocks, the selection blocks the
    score kernel takes a step (their compressed tokens are the columns of its product);
    select_warps, the select kernel's warps a row (0: topk._select_launch's rule by row length)."""
    rows: int = 128
    rows_interpret: int = 64
    warps: int = 4
    stages: int = 2
    score_budget: int = 1 << 28
    select_candidates: int = 128
    chunk_blocks: int = 16
    select_warps: int = 0

    def __post_init__(self):
        self._check_positive("rows", "rows_interpret", "warps", "stages", "score_budget", "select_candidates",
                             "chunk_blocks")
        if self.select_warps < 0 or self.select_warps & (self.select_warps - 1):
            raise ValueError(f"TopkTuning.select_warps is {self.select_warps}; expected 0 or a power of two")
        if self.chunk_blocks & (self.chunk_blocks - 1):
            raise ValueError(f"TopkTuning.chunk_blocks is {self.chunk_blocks}; expected a power of two")
        self._set_arg()


@dataclass(frozen=True)
class BandTiles(_Tuning):
    """Launches of the band kernels (nsa.kernels.band_attention) for one call: fwd, dq, dkv each a
    Tile or None for the measured table band_attention.TILES (and its float32 and interpreter
    rules); dkv_waves, the dk/dv pass's programs per SM that its row split aims at
    (band_attention._dkv_splits; 16 was the fastest of 2 to 32 in `python bench/bench_nsa.py
    --sweep --sweep-only "band split"` at m7c@32k and m7c@64k)."""
    fwd: Tile | None = None
    dq: Tile | None = None
    dkv: Tile | None = None
    dkv_waves: int = 16

    def __post_init__(self):
        for name in ("fwd", "dq", "dkv"):
            tile = getattr(self, name)
            if tile is not None and (len(tile) != 4 or min(tile) <= 0):
                raise ValueError(f"BandTiles.{name} is {tile!r}; expected (BM, BN, num_warps, num_stages), all > 0")
        self._check_positive("dkv_waves")
        self._set_arg()


#: the defaults, what the model's calls take
SELECTION = SelectionTuning()
TOPK = TopkTuning()
BAND = BandTiles()
