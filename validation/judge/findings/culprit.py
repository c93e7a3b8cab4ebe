"""A diagnosis (validation/judge/diagnosis/) in words: who it blames and what they did, as the
crash and stall findings and the point's verdict line (headline.py) say it, so that neither reads
the other's text and both say the same."""
from __future__ import annotations

from dataclasses import replace

from nsa.contract import HEARTBEAT_STAGES_AFTER_STEP
from validation.contract.stacks import StackDump
from validation.contract.torchrun_log.exceptions import own_frame
from validation.judge.diagnosis.blame import Check, Diagnosis, Kind, RankAt
from validation.excerpt import EXCERPT_CHARS

#: what a blamed rank did, by the kind of the diagnosis
DID = {Kind.CRASHED: "crashed", Kind.KILLED: "crashed", Kind.ABORTED: "crashed", Kind.QUIT: "exited early",
       Kind.HUNG: "hung", Kind.STALLED: "stalled", Kind.SILENT: "hung",
       Kind.LEFT: "exited 0 early", Kind.ENDED: "exited 0", Kind.NONFINITE: "had a non-finite loss",
       Kind.HALTED: "halted on a non-finite loss", Kind.HALT_STALL: "halted on a non-finite loss",
       Kind.NONFINITE_EXIT: "stopped on a non-finite loss", Kind.IMPORTING: "was still importing"}


#: where no rank failed in its own right, what the launch's failure was instead of a crash: a rank
#: exited 0 while the others still needed it (before its last step, or before their collective
#: after it), they failed in their collectives without it, and torchrun then failed the launch
NO_CRASH = {Kind.LEFT: "early exit", Kind.ENDED: "exit before the others"}


def failed_without(d: Diagnosis) -> str:
    """'the other ranks failed without it' ('them' of several ranks that left)."""
    return f"the other ranks failed without {'it' if len(d.ranks) == 1 else 'them'}"


def ranks(ks: list[int] | tuple[int, ...]) -> str:
    """'rank 2', 'ranks 1, 2'."""
    return f"rank{'s' * (len(ks) > 1)} {', '.join(map(str, ks))}"


def who(at: RankAt) -> str:
    """'rank 1', "node 1's rank 3", 'rank unknown (pid 42)'."""
    if at.rank is None:
        return "rank unknown" + (f" (pid {at.pid})" if at.pid is not None else "")
    return (f"{at.node}'s " if at.node else "") + f"rank {at.rank}"


def beat(at: RankAt) -> str:
    """'last heartbeat step 3, stage forward' (the stall and crash findings' words); of a process
    torchrun started again that wrote none, 'no heartbeat of pid 13657; its last heartbeat step 3,
    stage forward was pid 13631's, of an earlier attempt'."""
    if at.rank is None or (at.step is None and not at.beats):
        return ""
    if at.step is None:
        return "no heartbeat written"
    said = f"last heartbeat step {at.step}" + (f", stage {at.stage}" if at.stage else "")
    if at.beat_pid is not None:
        return f"no heartbeat of pid {at.now_pid}; its {said} was pid {at.beat_pid}'s, of an earlier attempt"
    return said


def waited_cause(d: Diagnosis) -> str:
    """Of ranks others gave up waiting for: 'rank 1 gave up waiting for it in a collective (rank 1:
    ...); it was still running, outside that collective, when torchrun ended the run (SIGTERM)'."""
    return (f"{ranks(d.waited)} gave up waiting for {'it' if len(d.ranks) == 1 else 'them'} in a collective "
            f"(rank {d.waited[0]}: {(d.cause or '')[:EXCERPT_CHARS]}); it was still running, outside that collective, when "
            "torchrun ended the run (SIGTERM)")


def cause(d: Diagnosis, at: RankAt) -> str:
    """What the diagnosis says ended or stopped ``at``."""
    if d.silences:
        return next(s.silence() for s in d.silences if s.rank == at.rank)
    return waited_cause(d) if d.waited else at.cause


def silenced(d: Diagnosis) -> str:
    """Of a diagnosis of silent ranks (Kind.SILENT): 'rank 1 hung at step 3 in wait: its heartbeats
    showed no new step for 8s while rank 0 went on to step 40', each rank's joined by '; '."""
    return "; ".join(f"{who(at)} hung at step {s.step}" + (f" in {at.frame}" if at.frame else "") + f": {s.silence()}"
                     for at, s in zip(d.ranks, d.silences))


def short_path(path: str) -> str:
    """A source file as the stack lines show it: its folder and name ('u/train.py')."""
    return "/".join(path.replace("\\", "/").split("/")[-2:])


def went_apart(d: Diagnosis) -> str:
    """Of ranks whose collectives went apart: 'rank 1 is in a collective the other ranks never reached:
    all_reduce at u/train.py:19 (sync_metrics; last heartbeat step 3, stage backward); rank 0 waits in
    all_reduce at u/train.py:48 (main; last heartbeat step 3, stage backward)' (Kind.DIVERGED); 'ranks 0, 1
    wait in different collectives: rank 0 in ...; rank 1 in ...: nothing tells which of the two left the
    common path (...)' (Kind.APART)."""
    if d.kind == Kind.APART:
        each = "; ".join(f"{who(at)} in {_place(at)}" for at in d.ranks)
        why = ("nothing tells which of the two left the common path (a collective extra on one reads the same as "
               "one missing on the other)" if len(d.ranks) == 2 else
               "no majority of the ranks waits at one place, so nothing tells which left the common path")
        return f"{_names(d.ranks)} wait in different collectives: {each}: {why}"
    one = len(d.ranks) == 1
    off = "; ".join(_place(at) if one else f"{who(at)} in {_place(at)}" for at in d.ranks)
    shared = {beat(at) for at in d.common}
    # the ranks of the common path share a step and call site; their stages may differ
    where = _place(d.common[0], beat(d.common[0]) if len(shared) == 1 else "")
    # at the others' call site, only its step is apart: the others did reach that collective, at their own step
    how = ("the other ranks never reached" if any(at.site != d.common[0].site for at in d.ranks)
           else "at another step than the other ranks")
    return (f"{_names(d.ranks)} {'is' if one else 'are'} in a collective {how}: {off}; "
            f"{_names(d.common)} {'waits' if len(d.common) == 1 else 'wait'} in {where}")


def mismatched(d: Diagnosis) -> str:
    """Of ranks whose collectives a check found not matching (Kind.MISMATCHED): "the ranks' collectives did not
    match: gloo's check of a message's size aborted rank 0 (op.preamble.length <= op.nbytes. 8 vs 4. Received
    data size doesn't match expected size), where the mismatch was detected; rank 0 was in all_reduce at
    u/train.py:30 (main; last heartbeat step 3, stage backward), rank 1 in all_reduce at u/train.py:10
    (log_metrics; ...): nothing tells which of the two left the common path (...)"; where a majority of the
    ranks was at one call site, 'rank 1 called all_reduce at ... where ranks 0, 2 called all_reduce at ...'."""
    said = (f"the ranks' collectives did not match: {detected_by(d)} ({d.detected.said[:EXCERPT_CHARS]}), where the "
            "mismatch was detected")
    if d.common:
        one = len(d.ranks) == 1
        off = ", ".join(_place(at) if one else f"{who(at)} {_place(at)}" for at in d.ranks)
        return (f"{said}; {_names(d.ranks)} called {off} where {_names(d.common)} called {_place(d.common[0], '')}: "
                f"{'it' if one else 'they'} left the common path")
    each = ", ".join(f"{who(at)} {'was ' * (i == 0)}in {_place(at)}" if at.frame else f"{who(at)} ({beat(at)})"
                     for i, at in enumerate(d.ranks))
    sites = {at.site for at in d.ranks}
    if d.detected.unknown:
        why = (f"the log shows no collective of {_names_of(d.detected.unknown, d)}, so nothing tells which rank left "
               "the common path")
    elif len(sites) == 1:
        why = "one call site: the ranks passed it tensors of other sizes or types"
    elif len(d.ranks) == 2:
        why = ("nothing tells which of the two left the common path (a collective extra on one reads the same as "
               "one missing on the other)")
    else:
        why = "no majority of the ranks was at one call site, so nothing tells which left the common path"
    return f"{said}; {each}: {why}"


def detected_by(d: Diagnosis) -> str:
    """Of Kind.MISMATCHED: the check and the ranks it ended, "gloo's check of a message's size aborted rank 0"."""
    found = d.detected
    how = "aborted" if found.check == Check.GLOO_SIZE else "raised in"
    return f"{found.check} {how} {_names_of(found.ranks, d)}"


def out_of_step(d: Diagnosis) -> str:
    """Of ranks that failed or waited in a collective within a step a rank had completed before it exited 0
    (Kind.OUT_OF_STEP): 'rank 1 failed in all_reduce at u/train.py:110 (main) during step 8 (RuntimeError:
    Connection closed by peer [127.0.0.1]:4020), a step rank 0 had completed before it exited 0 (last heartbeat
    step 8, stage step): the ranks' collectives were out of step: rank 1 had called more collectives than rank 0
    by then, one of its own that rank 0 never called or one rank 0 skipped, earlier in the run; which, and at
    which step, these files do not tell'; of ranks that waited (``Diagnosis.waiting``), 'rank 1 waited in
    all_reduce at u/train.py:110 (main) during step 8 (with no partner left), a step rank 0 ...'; of a rank of no
    stack (``Diagnosis.suspected``), 'rank 1 was still running within step 8 (no stack: which call it waited in is
    unknown; last heartbeat step 8, stage backward), a step rank 0 ...: the ranks' collectives may have been out of
    step: ..., or rank 1 hung of its own after its part in that step's collectives; with no stack of it, these
    files do not tell which'."""
    did = "waited in" if d.waiting else "failed in"
    failed = "; ".join(f"{who(at)} was still running within step {at.step} ({at.no_stack}: which call it waited in "
                       f"is unknown; {beat(at)})" if at.no_stack is not None else
                       f"{who(at)} {did} {_place(at, '')} during step {at.step}"
                       + (" (with no partner left)" if d.waiting else f" ({at.cause})" if at.cause else "")
                       for at in d.ranks)
    one, own = len(d.ended) == 1, "its" if len(d.ranks) == 1 else "their"
    steps = "a step" if len({at.step for at in d.ranks}) == 1 else "steps"
    beats = "; ".join(beat(at) if one else f"{who(at)}: {beat(at)}" for at in d.ended)
    left, off = _names(d.ended), _names(d.ranks)
    more = (f"more collectives than {left} by then, one of {own} own that {left} never called or one {left} skipped, "
            "earlier in the run")
    said = (f"{failed}, {steps} {left} had completed before {'it' if one else 'they'} "
            f"{'exited 0' if d.ended_exit_0 else 'left'} ({beats}): ")
    if not d.suspected:
        return (f"{said}the ranks' collectives were out of step: {off} had called {more}; which, and at which step, "
                "these files do not tell")
    unseen = tuple(at for at in d.ranks if at.no_stack is not None)
    its, them = ("its", "it") if len(unseen) == 1 else ("their", "them")
    those, theirs = ("that step", "that step's") if steps == "a step" else ("those steps", "those steps'")
    return (f"{said}the ranks' collectives may have been out of step ({off} left waiting in a collective of {those} "
            f"with no partner, having called {more}), or {_names(unseen)} hung of {its} own after {its} part in "
            f"{theirs} collectives; with no stack of {them}, these files do not tell which")


def still_ending(d: Diagnosis) -> str:
    """Of ranks that left early and were still ending when torchrun's agent ended them (``Diagnosis.broken``): 'rank
    0 left early after step 5 (last heartbeat step 5, stage step) and was still ending when torchrun's agent ended it
    (SIGTERM): its connections closed under rank 1's all_reduce at tests/record_trainer.py:163 (main) during step 6
    (RuntimeError: Connection closed by peer [127.0.0.1]:20401)'; where that is suspected (``Diagnosis.suspected``),
    "node 0's rank 0 may have left early after step 5 (...) and been still ending when torchrun's agent ended it
    (SIGTERM): node 1's rank 1's all_reduce ... broke during step 6 (RuntimeError: Connection reset by peer); those
    words fit as well a network that failed between the hosts while node 0's rank 0 still ran; torchrun's SIGTERM
    ends a rank still running and one still ending alike" (of several ranks stopped behind: 'only one of ranks 0, 2
    need have left, the other running code of its own between steps')."""
    one = len(d.ranks) == 1
    left = "; ".join(f"{who(at)} {'may have ' * d.suspected}left early"
                     + (f" after step {at.step}" if at.stage in HEARTBEAT_STAGES_AFTER_STEP else "") + f" ({beat(at)})"
                     for at in d.ranks)
    ending = "and been still ending" if d.suspected else "and was still ending" if one else "and were still ending"
    # a rank's error without a traceback that ends in torch.distributed's frames names no collective
    broke = "; ".join(f"{who(at)}'s {_place(replace(at, frame=at.frame or 'collective'), '')}{' broke' * d.suspected} "
                      f"during step {at.step}"
                      + (f" ({at.cause})" if at.cause else "") for at in d.broken.ranks)
    said = f"{left} {ending} when torchrun's agent ended {'it' if one else 'them'} (SIGTERM): "
    if not d.suspected:
        return f"{said}{'its' if one else 'their'} connections closed under {broke}"
    gone, others = _names(d.ranks), len(d.ranks) > 2
    why = ([f"those words fit as well a network that failed between the hosts while {gone} still ran"]
           if d.broken.network_fits else []) + (
        [] if one else [f"only one of {gone} need have left, the other{'s' * others} running code of "
                        f"{'their' if others else 'its'} own between steps"])
    return f"{said}{broke}; {'; '.join(why)}; torchrun's SIGTERM ends a rank still running and one still ending alike"


def still_importing(d: Diagnosis) -> str:
    """Of processes all inside an import (Kind.IMPORTING): 'every rank found running was still importing, none
    waiting for another: rank 0 torch.distributed.tensor._ops (line 13; imported from mytr/train.py:19; no
    heartbeat written); rank 1 in _compile_bytecode, Python's import machinery (imported from ...)'."""
    def one(at: RankAt) -> str:
        said = [p for p in (_imported(at), beat(at)) if p]
        return f"{who(at)} {_import_place(at)}" + (f" ({'; '.join(said)})" if said else "")

    every = "the one process" if len(d.ranks) == 1 else "every process" if d.ranks[0].rank is None else "every rank"
    return f"{every} found running was still importing, none waiting for another: {'; '.join(map(one, d.ranks))}"


def _import_place(at: RankAt) -> str:
    """'torch.distributed.tensor._ops' (the module a rank was importing, as a Python name where it can be
    told), 'in _compile_bytecode, Python's import machinery' where the machinery itself ran."""
    module = at.importing.module if at.importing else None
    return module_name(module.file) if module else f"in {at.frame}, Python's import machinery"


def _imported(at: RankAt) -> str:
    """'line 13; imported from mytr/train.py:19': where in its module a rank importing was, and the
    trainer's line that began the import; '' where neither is known."""
    imp = at.importing
    if imp is None:
        return ""
    return "; ".join(p for p in (f"line {imp.module.line}" if imp.module else "",
                                 f"imported from {short_path(imp.origin.file)}:{imp.origin.line}" if imp.origin else "")
                     if p)


def module_name(path: str) -> str:
    """'torch.distributed.tensor._ops' for a module's file under site-packages; else the file as the stack
    lines show it (``short_path``)."""
    path = path.replace("\\", "/")
    for root in ("/site-packages/", "/dist-packages/"):
        if root in path:
            return path.split(root, 1)[1].removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return short_path(path)


def _names_of(ks: tuple[int, ...], d: Diagnosis) -> str:
    """``_names`` of ranks by number, each with its node where the diagnosis knows it."""
    known = {at.rank: at for at in (*d.ranks, *d.common)}
    return _names(tuple(known.get(k, RankAt(k)) for k in ks))


def _names(ats: tuple[RankAt, ...]) -> str:
    """'ranks 0, 2'; each by ``who`` where a node is known ("node 0's rank 0, node 1's rank 2")."""
    if any(at.node for at in ats):
        return ", ".join(map(who, ats))
    return ranks([at.rank for at in ats])


def _place(at: RankAt, said: str | None = None) -> str:
    """'all_reduce at u/train.py:19 (sync_metrics; last heartbeat step 3, stage backward)': the collective
    a rank waits in, the code that called it and its heartbeat (``said``, where given)."""
    said = beat(at) if said is None else said
    if at.site is None:
        return f"{at.frame}" + (f" ({said})" if said else "")
    inner = "; ".join(p for p in (at.site.func, said) if p)
    return f"{at.frame} at {short_path(at.site.file)}:{at.site.line} ({inner})"


def text(d: Diagnosis) -> str:
    """'rank 1 crashed (last heartbeat step 2, stage forward): RuntimeError: boom', 'rank 1 hung in
    wait (last heartbeat step 3, stage backward)', 'rank 1 hung (stopped, no stack; last heartbeat
    step 3, stage forward)'; several ranks joined by '; '; with ``or_else``, 'rank 0 crashed (...): exit
    code 1, or rank 2 exited 0 early (...) and the others failed after it: which came first cannot be told';
    ranks whose collectives went apart as ``went_apart`` says them, those a check found not matching as
    ``mismatched``, those whose collectives went out of step as ``out_of_step``, those that left early and were
    still ending when torchrun ended them as ``still_ending``; ranks that left early whose
    collectives were out of step as well (``Diagnosis.beside``) with it: 'rank 0 exited 0 early (...); besides,
    rank 1 failed in all_reduce ... during step 5 ..., a step rank 0 had completed ...'."""
    if d.kind in (Kind.DIVERGED, Kind.APART):
        return went_apart(d)
    if d.kind == Kind.MISMATCHED:
        return mismatched(d)
    if d.kind == Kind.OUT_OF_STEP:
        return out_of_step(d)
    if d.kind == Kind.IMPORTING:
        return still_importing(d)
    if d.broken is not None:
        return still_ending(d) + (f"; besides, {out_of_step(d.beside)}" if d.beside is not None else "")
    own = "; ".join(f"{who(at)} {DID[d.kind]}" + (f" in {at.frame}" if at.frame else "") + importing_note(at)
                    + workers_note(at) + _said(at) + (f": {c}" if (c := cause(d, at)) else "") for at in d.ranks)
    if d.beside is not None:
        return f"{own}; besides, {out_of_step(d.beside)}"
    if d.or_else is None:
        return own
    return f"{own}, or {text(d.or_else)} and the others failed after it: which came first cannot be told"


def importing_note(at: RankAt) -> str:
    """', still importing torch.distributed.fsdp (line 13; imported from mytr/train.py:3)' of a rank blamed as
    hung whose stack was inside an import; '' otherwise."""
    if at.importing is None:
        return ""
    where = _imported(at)
    module = at.importing.module
    return (f", still importing {module_name(module.file)}" if module else ", still importing") + (f" ({where})" if where else "")


def workers_note(at: RankAt) -> str:
    """', waiting for its data loader's workers: pid 4242 in Data.__getitem__ (u/train.py:27)' of a rank
    blamed as hung that waited for its DataLoader's worker processes, each worker whose stack was taken by
    its innermost frame and, below torch's and Python's own, the trainer's; '' otherwise."""
    if at.workers is None:
        return ""
    if not at.workers:
        return ", waiting for its data loader's workers (no stack of them was taken)"
    return ", waiting for its data loader's workers: " + "; ".join(
        f"pid {w.pid} " + _where_worker(w) for w in at.workers)


def _where_worker(w: StackDump) -> str:
    """'in Data.__getitem__ (u/train.py:27)'; 'in sleep (time.py:..), under Data.__getitem__ (u/train.py:27)'
    where the innermost frame is not the trainer's own."""
    if not w.frames:
        return "(no frame)"
    inner = w.frames[0]
    said = f"in {inner.func} ({short_path(inner.file)}:{inner.line})"
    own = own_frame(w.frames)
    return said if own is None or own == inner else f"{said}, under {own.func} ({short_path(own.file)}:{own.line})"


def _said(at: RankAt) -> str:
    """' (stopped, no stack; last heartbeat step 3, stage forward)': why it has no stack, and its heartbeat."""
    parts = [p for p in (at.no_stack, beat(at)) if p]
    return f" ({'; '.join(parts)})" if parts else ""
