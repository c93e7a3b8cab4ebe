"""What a rank's last heartbeat says of its steps: whether it completed the last step asked for
(``incomplete``) or only started it (``started_last``), and which ranks got least far
(``behind``)."""
from __future__ import annotations

from collections.abc import Mapping

from nsa.contract import HEARTBEAT_STAGES_IN_STEP
from validation.judge.record import Beat

#: the stages of one step in the order a rank enters them (nsa/contract.py's heartbeat ``stage``)
STAGE_ORDER = ("data", "forward", "backward", "optimizer", "step")


def behind(ranks: list[int], beats: Mapping[int, Beat]) -> list[int]:
    """Those of ``ranks`` furthest behind by their last heartbeat: the lowest step, then the
    earliest stage of it (where every stage is one whose order is known); all of them when one
    has no heartbeat. Where no stack tells (every rank outside the collectives in frames py-spy
    shows, or none recorded), the hung rank is the one that never got as far in the step."""
    if not ranks or any(k not in beats or beats[k].step is None for k in ranks):
        return ranks
    low = min(beats[k].step for k in ranks)
    ranks = [k for k in ranks if beats[k].step == low]
    if any(beats[k].stage not in STAGE_ORDER for k in ranks):
        return ranks
    first = min(STAGE_ORDER.index(beats[k].stage) for k in ranks)
    return [k for k in ranks if STAGE_ORDER.index(beats[k].stage) == first]


def incomplete(beat: Beat | None, steps: int) -> bool:
    """The rank whose last heartbeat is ``beat`` did not complete ``steps``: its last record is of
    an earlier step, or of a stage within the last one (that step in progress). False where the
    record may say the last step was completed, or says no step."""
    if beat is None or beat.step is None:
        return False
    return beat.step < steps or (beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP and beat.ends_steps)


def started_last(beat: Beat | None, steps: int) -> bool:
    """``beat`` is a record within the last step of a rank whose heartbeats record no step's end:
    it started the last step, and its records cannot say whether it completed it."""
    return (beat is not None and beat.step == steps and beat.stage in HEARTBEAT_STAGES_IN_STEP
            and not beat.ends_steps)
