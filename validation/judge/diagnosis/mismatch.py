"""The diagnosis of a run a check of its collectives ended (``mismatched``): gloo's check of a message's
size aborted a rank, or torch's check under TORCH_DISTRIBUTED_DEBUG=DETAIL raised. The rank a check ended
is where the mismatch was detected: gloo's aborts the rank that received a message of another size than
its own collective's, which is the rank that did not leave the common path as often as the one that did.
Which rank left it is told by the call sites the log shows (each rank's traceback, the aborted rank's
report of its abort), as ``collectives.apart`` tells it of ranks waiting: the ranks away from the call
site a strict majority of the ranks was at; else nothing tells."""
from __future__ import annotations

from validation.judge.diagnosis.blame import Check, Detected, Diagnosis, Kind, RankAt, diagnosis_of, logs_of
from validation.judge.diagnosis.collectives import majority
from validation.judge.record import PhaseRecord


def mismatched(r: PhaseRecord) -> Diagnosis | None:
    """Of a failed run some rank of which a check of the collectives ended (RankFailure.mismatch): the
    ranks off the common path beside those of it, where a strict majority of the ranks was at one call
    site; else every rank whose collective the log shows (and each rank the check ended), at its call
    site. None where no check ended a rank."""
    failures = r.evidence.rank_failures
    detected = sorted(k for k, f in failures.items() if f.mismatch is not None)
    if not detected:
        return None
    # a rank's call site where its traceback (or report of its abort) ends in a collective: one that ends in
    # its own code says nothing of where its collectives were
    sites = {k: f.raised_at for k, f in failures.items() if f.collective is not None and f.raised_at is not None}
    first = failures[detected[0]]
    check = Detected(Check.GLOO_SIZE if first.exception is None else Check.TORCH_DETAIL, tuple(detected),
                     first.mismatch, tuple(k for k in range(r.world_size) if k not in sites))

    def at(k: int) -> RankAt:
        f = failures[k]
        return RankAt.of(r, k, frame=f.collective, cause=f.cause or "", site=sites.get(k))

    split = majority(sites, r.world_size) if sites else None
    if split is not None and split.off:
        off, common = split.off, split.common
    else:
        off, common = tuple(sorted(set(sites) | set(detected))), ()
    return diagnosis_of(Kind.MISMATCHED, tuple(map(at, off)), r, common=tuple(map(at, common)),
                        cause=f"{check.check}: {check.said}", logs=logs_of(r, detected), detected=check)
