"""Findings about runs that went wrong as processes: crashes, non-finite losses, stalls, idle or
imbalanced ranks, broken output contracts, and failed gates. Where each rank was and how it
ended, from the record's evidence."""
from __future__ import annotations

import enum
from dataclasses import replace

from nsa.contract import ENV_PROFILE, PROFILE_JSON, PROFILE_TOP_OPS, heartbeat_name
from validation.contract.files import HaltInfo
from validation.contract.stacks import StackDump
from validation.contract.torchrun_log import short_exception
from validation.judge.findings import stability
from validation.judge.diagnosis.blame import FAILED, Diagnosis, Kind, NoStack, logs_of
from validation.judge.diagnosis.crash import crash
from validation.judge.diagnosis.failed import root_of_evidence
from validation.judge.diagnosis.left import (broke_on_peer, ended_before, exited_0, left_ending, maybe_departed,
                                             silent_first)
from validation.judge.diagnosis.nonfinite import nonfinite, nonfinite_ranks
from validation.judge.diagnosis.stall import ending, stall
from validation.judge.findings.culprit import ranks as _ranks
from validation.judge.findings.culprit import (NO_CRASH, failed_without, importing_note, mismatched, out_of_step,
                                               short_path, silenced, still_ending, still_importing, waited_cause,
                                               went_apart, workers_note)
from validation.judge.findings.departed import departure
from validation.judge.findings.finding import (Facts, Finding, Severity, attempt_logs, attempts_said, last_heartbeat,
                                               own_reason, process, processes, where, where_gated, where_run)
from validation.judge.findings.nodes import STRAGGLER_MIN_S, STRAGGLER_SHARE
from validation.judge.gates import GOLDEN_METRIC, REPEAT_LOSS_METRIC, GateResult, GateVerdict, Overruled
from validation.judge.provenance import short_commit
from validation.judge.record import HARNESS_ERROR_FILE, TRAINER_KINDS, NotRun, PhaseRecord, Status
from validation.judge.resume import METRICS as RESUME_METRICS
from validation.judge.unsteady import Cause, heartbeat_files
from validation.judge.verdict import Outcome, halt_said
from validation.excerpt import EXCERPT_CHARS

#: slowest / fastest rank median step time above which ranks are called imbalanced
IMBALANCE_RATIO = 1.5
#: the metric of that ratio: a failed gate on it is stated by the imbalance finding
IMBALANCE_METRIC = "rank_step_time_ratio"


#: a crash finding's title word of a diagnosis that is no crash (the others, culprit.py ``NO_CRASH``): the
#: trainer exited with the contract's code for a non-finite loss, its own word of what stopped it
_NOT_CRASH = {**NO_CRASH, Kind.NONFINITE_EXIT: "non-finite loss", Kind.MISMATCHED: "collective mismatch",
              Kind.OUT_OF_STEP: "collectives out of step"}


def crashes(records: list[PhaseRecord]) -> list[Finding]:
    """A crash (or a non-finite loss the trainer stopped on) of each process: every repeat's."""
    return process_crashes(processes(records))


def process_crashes(records: list[PhaseRecord]) -> list[Finding]:
    """A crash finding of each record's own process (the one whose evidence it keeps), in the words
    of its diagnosis (validation/judge/diagnosis/ ``nonfinite``, ``crash``)."""
    out = []
    for r in records:
        ev = r.evidence
        if (d := nonfinite(r)) is not None:
            bad = nonfinite_ranks(r)
            # this project's guard halts before the optimizer step; of another trainer that is not known
            before = "; halted before the optimizer step" if r.own_trainer else ""
            title = (f"non-finite loss in {where_run(r)} at step {ev.halt.step}: {'rank' if len(bad) == 1 else 'ranks'} "
                     f"{', '.join(map(str, bad)) or '?'} (loss per rank {ev.halt.losses}, grad_norm {ev.halt.grad_norm})"
                     f"{before}") if ev.halt.losses is not None else (
                f"non-finite loss in {where_run(r)} at step {ev.halt.step}: {_halted_text(d)}the trainer's .HALT says "
                f"{ev.halt.text[:EXCERPT_CHARS]!r}")
            out.append(Finding(Severity.CRITICAL, r.phase, title, [f".HALT: {r.out_dir}/.HALT"] + _rank_lines(r, bad)
                               + _earlier_attempts(r), "nonfinite", Facts.of(r), d if d.ranks else None))
            continue
        if (d := crash(r)) is None:
            continue
        for each in (d, *((d.beside,) if d.beside is not None else ())):  # an early exit out of step too: both
            out.append(_crash_finding(r, each))
    return out


def _crash_finding(r: PhaseRecord, d: Diagnosis) -> Finding:
    """The crash finding of ``r``'s diagnosis ``d`` (``crash``), or of the ranks out of step beside its early exit
    (``Diagnosis.beside``)."""
    ev = r.evidence
    title = f"{_NOT_CRASH.get(d.kind, 'crash')} in {where_run(r)}: exit code {r.exit_code}"
    kind = {Kind.LEFT: "departed", Kind.ENDED: "left_after", Kind.HUNG: "waited", Kind.ABORTED: "aborted",
            Kind.QUIT: "quit", Kind.NONFINITE_EXIT: "nonfinite", Kind.MISMATCHED: "mismatch",
            Kind.OUT_OF_STEP: "out_of_step"}.get(d.kind, "crash")
    if d.kind in FAILED and d.ranks and not d.from_log:
        title += ": " + "; ".join(f"rank {at.rank}{' exited early' * (d.kind == Kind.QUIT)}: {at.cause}"
                                  for at in d.ranks)
        if d.or_else is not None:  # a silent exit may be a rank catching its collective broken by one that left
            first, maybe = [at.rank for at in d.ranks], [at.rank for at in d.or_else.ranks]
            title += (f", or {departure(r, maybe)} and {_ranks(first)} failed after it: torchrun's SIGTERM "
                      f"of {_ranks(maybe)} once {_ranks(first)} had failed ends a rank still running and one "
                      "still exiting alike, so which came first cannot be told")
    elif d.broken is not None:  # it left, and its closed connections broke the others' collective as it ended
        title += f": {still_ending(d)}"
    elif d.kind == Kind.LEFT:  # no rank failed in its own right: the others failed after one that left
        title += f": {departure(r, [at.rank for at in d.ranks])}; {failed_without(d)}"
    elif d.kind == Kind.ENDED:
        # no rank failed in its own right, and none left early: one that may have done all its
        # steps ended while the others still had a collective with it (after the loop: a barrier,
        # a save, teardown). torchrun's own line (ChildFailedError) would say nothing of either.
        ended = [at.rank for at in d.ranks]
        failed = [f"rank {k}: {short_exception(f.exception)}" for k, f in sorted(ev.rank_failures.items())
                  if f.exception]
        title += (f": {_exits(r, ended)}, and {failed_without(d)}"
                  + (f": {'; '.join(failed)}" if failed else ""))
    elif d.kind == Kind.MISMATCHED:
        title += f": {mismatched(d)}"
    elif d.kind == Kind.OUT_OF_STEP:
        title += f": {out_of_step(d)}"
    elif d.kind == Kind.HUNG:
        title += f": {_ranks([at.rank for at in d.ranks])} hung: {waited_cause(d)}"
    elif d.kind == Kind.NONFINITE_EXIT:
        who = _ranks([at.rank for at in d.ranks]) if d.ranks and r.world_size > 1 else "the trainer"
        title += f": {who} {d.cause}"
    elif d.from_log and d.cause:
        title += f": {d.cause}"
    # a file the run broke after it had stepped (a crash decides the verdict, and a start-up
    # crash leaves files missing that say nothing more)
    stepped = Outcome.of_record(r)
    broken = ([f"broken contract file: {e}" for e in ev.errors]
              if stepped.steps_completed or stepped.last_step_done else [])
    facts = replace(Facts.of(r), ending=d.broken is not None or not d.ended_exit_0, suspected=d.suspected)
    return Finding(Severity.CRITICAL, r.phase, title, [f"stderr: {p}" for p in d.logs] + broken
                   + _rank_lines(r) + _earlier_attempts(r), kind, facts, d if d.ranks else None)


def _earlier_attempts(r: PhaseRecord) -> list[str]:
    """How each attempt ended that torchrun started the workers again after (``--max-restarts``),
    by its agent's line per attempt, each with its own failure: the finding's title and rank lines
    are the last attempt's, the run's end, and an earlier attempt's exception is none of theirs."""
    earlier = [a for a in r.evidence.attempts if a.restarted]
    if not earlier:
        return []
    logs = attempt_logs(r.evidence, earlier)
    return [f"earlier attempts, each followed by torchrun starting the workers again{logs}: "
            + attempts_said(earlier)]


def halts(records: list[PhaseRecord]) -> list[Finding]:
    """A trainer process (every repeat's) that halted itself on a .HALT that is neither its
    watchdog's (a stall, ``stalls``) nor its non-finite guard's (``crashes``): an operator's stop,
    or a stop condition of the trainer's own. Its .HALT is the verdict whatever its gates, so it
    is named as the non-finite one is: at which step of how many (a run that stopped short is
    not the run asked for), what the .HALT says and where it is."""
    out = []
    for r in processes(records):
        outcome = Outcome.of_record(r)
        if r.kind not in TRAINER_KINDS or not outcome.halted_itself:
            continue
        ev = r.evidence
        left = (outcome.steps_requested or 0) - (outcome.halt_step or 0)
        short = f" ({left} step{'s' * (left != 1)} short of the run asked for)" if outcome.halted_short else ""
        exit_code = f"; exit code {r.exit_code}" if r.exit_code not in (0, None) else ""
        title = f"{where_run(r)}: the trainer halted itself {outcome.halt_at()}{short} on a .HALT{_halt_words(ev.halt)}{exit_code}"
        detail = [f".HALT: {r.out_dir}/.HALT"]
        if "training.csv" in ev.files:
            detail.append(f"CSV: {r.out_dir}/training.csv")
        detail += [f"stderr: {p}" for p in logs_of(r, sorted(ev.last_heartbeat))] + _rank_lines(r)
        out.append(Finding(Severity.CRITICAL, r.phase, title, detail, "halted", Facts.of(r)))
    return out


def _halt_words(halt: HaltInfo) -> str:
    """Whose .HALT it is and what it says, quoted: " that neither its watchdog nor its non-finite
    guard wrote, which says 'operator stop'" (', an empty file'; ', from ops, which says ...'); of a
    record cut short before its source, which cannot tell whose it is, the verdict's words."""
    if halt.torn and halt.source is None:
        return halt_said(halt)
    text = halt.text[:EXCERPT_CHARS]
    says = f", which says {text!r}" if text else ", an empty file"
    return (" that neither its watchdog nor its non-finite guard wrote"
            + (f", from {halt.source}" if halt.source is not None else "") + says
            + (" (its record cut short)" if halt.torn else ""))


def _halted_text(d: Diagnosis) -> str:
    """'rank 1 halted on it (a halt record), the other ranks did not; ' where the diagnosis names ranks
    that halted (Kind.HALTED)."""
    if d.kind != Kind.HALTED or not d.ranks:
        return ""
    halted = [at.rank for at in d.ranks]
    return (f"{'rank' if len(halted) == 1 else 'ranks'} {', '.join(map(str, halted))} halted on it (a halt record), "
            f"the other ranks did not; ")


def short_runs(records: list[PhaseRecord]) -> list[Finding]:
    """A train point (every repeat of one) that exited 0 without a .HALT before the steps it was
    asked for, or past them: no crash, no stall, and still not the run that was asked for."""
    out = []
    for r in processes(records):
        outcome = Outcome.of_record(r)
        if outcome.stopped_short or outcome.ran_past:
            out.append(Finding(Severity.CRITICAL, r.phase, f"{where_run(r)}: {outcome.short_text()}",
                               [f"CSV: {r.out_dir}/training.csv", f"stderr: {r.out_dir}/{r.evidence.stderr_log}"],
                               "long_run" if outcome.ran_past else "short_run", Facts.of(r)))
        elif outcome.rank_stopped_short:  # training.csv (rank 0) is complete; a rank's own heartbeats are not
            ahead = outcome.csv_ahead is not None  # ... or only against the CSV, which goes beyond every rank's
            out.append(Finding(Severity.CRITICAL, r.phase, f"{where_run(r)}: {outcome.short_text()}",
                               [f"CSV: {r.out_dir}/training.csv"] * ahead
                               + [f"heartbeats: {r.out_dir}/heartbeat_rank{k.rank}.jsonl" for k in outcome.short_ranks]
                               + [f"stderr: {p}" for p in logs_of(r, [k.rank for k in outcome.short_ranks])],
                               "csv_ahead" if ahead else "short_rank", Facts.of(r)))
    return out


def unprofiled(records: list[PhaseRecord]) -> list[Finding]:
    """A profile point that ran clean and left no profile.json (judge/unprofiled.py): UNMEASURED
    whatever its gates read, and said here, as a point whose gates read no profile would say nothing
    of it. A trainer that said why is quoted; one that did not ignored the request."""
    out = []
    for r in records:
        missing = r.evidence.no_profile
        if missing is None:
            continue
        out.append(Finding(Severity.WARNING, r.phase, f"profile point {where(r)} profiled nothing: {missing.text()}",
                           [f"run directory: {r.out_dir} (no {PROFILE_JSON}"
                            + ("" if missing.explained else f"; no note in env.json's {ENV_PROFILE}") + ")",
                            "the point is UNMEASURED: a profile phase is run for its profile, whatever its gates read"],
                           "not_profiled" if missing.explained else "no_profile", Facts.of(r)))
    return out


def _exits(r: PhaseRecord, ranks: list[int]) -> str:
    """'rank 1 exited 0 (last heartbeat step 8 of 8, stage step)' for each of ``ranks``."""
    beats = r.evidence.last_heartbeat
    return "; ".join(f"rank {k} exited 0 (last heartbeat step {beats[k].step} of {r.steps}"
                     + (f", stage {beats[k].stage})" if beats[k].stage else ")") for k in ranks)


def _rank_lines(r: PhaseRecord, nonfinite: list[int] = ()) -> list[str]:
    """Where each rank was (last heartbeat) and how it ended (torchrun's log). ``nonfinite``: the
    ranks whose own loss the trainer's .HALT says was non-finite: they stopped on it, and a SIGTERM
    torchrun sent them after is how their process ended, not what stopped them."""
    ev = r.evidence
    lines, gone, root, maybe = [], exited_0(r), root_of_evidence(ev), maybe_departed(r)
    ending, broke = left_ending(r), broke_on_peer(r)
    for rank in sorted(set(ev.last_heartbeat) | set(ev.rank_failures)):
        f = ev.rank_failures.get(rank)
        line = f"rank {rank}: {last_heartbeat(r, rank)}"
        if rank in nonfinite:
            line += (f"; stopped on its non-finite loss at step {ev.halt.step} (loss {ev.halt.losses[rank]}: the "
                     "trainer's .HALT)")
            if f is not None and f.signal == "SIGTERM" and f.by_agent:
                line += (", then killed by SIGTERM from torchrun's agent, which ends every rank still running once "
                         "one has ended with a failure")
            elif f is not None and f.cause:
                line += f", then {f.cause}"
        elif rank in gone:
            line += "; exited 0 (torchrun reports no failure of it)"
        elif f is not None and f.exception:
            line += f"; {f.located}"
        elif f is not None and rank in ending:
            line += (f"; killed by SIGTERM from torchrun's agent once {_ranks(broke)} had failed on a peer gone: "
                     "still ending then, after an early exit of its own, or still running (its heartbeats end before "
                     "their step)")
        elif f is not None and f.signal == "SIGTERM" and f.by_agent and rank in maybe:
            line += (f"; killed by SIGTERM from torchrun's agent once {_ranks(silent_first(r))} had failed: still "
                     "running then, or still exiting after an exit 0 of its own (its heartbeats end before their step)")
        elif f is not None and f.signal == "SIGTERM" and f.by_agent and root is not None and root != rank:
            line += f"; killed by SIGTERM from torchrun's agent, which ended the ranks still running once rank {root} had failed"
        elif f is not None and f.cause:
            line += f"; {f.cause}"
        lines.append(line)
    return lines


def _q(v) -> str:
    return "?" if v is None else str(v)


def stalls(records: list[PhaseRecord]) -> list[Finding]:
    """A stall of each process: every repeat's."""
    return process_stalls(processes(records))


def process_stalls(records: list[PhaseRecord]) -> list[Finding]:
    """A stall the harness saw (no progress for the phase's stall_s), a watchdog .HALT or the
    harness timeout of each record's own process, in the words of its diagnosis
    (validation/judge/diagnosis/stall.py ``stall``): where each rank was (heartbeat) and what it was
    doing (the innermost frames of its stack), every process whose rank cannot be told as "rank
    unknown". A pytest or preflight point ran no rank (its timeout is its own finding,
    findings/checks.py); a rank that died before the others' watchdog fired is the crash's."""
    out = []
    for r in records:
        if (d := stall(r)) is None:
            continue
        for each in (d, *((d.beside,) if d.beside is not None else ())):  # an early exit out of step too: both
            out.append(_stall_finding(r, each))
    return out


def _stall_finding(r: PhaseRecord, d: Diagnosis) -> Finding:
    """The stall finding of ``r``'s diagnosis ``d`` (``stall``), or of the ranks out of step beside its early exit
    (``Diagnosis.beside``)."""
    ev = r.evidence
    facts = Facts.of(r)
    how = ("stopped by the harness" if r.stalled_s is not None and d.kind == Kind.SILENT
           else f"no progress for {r.stalled_s:.0f}s, stopped by the harness" if r.stalled_s is not None
           else "watchdog .HALT" if ev.halt is not None else f"killed at the {r.timeout_s:g}s timeout")
    if d.kind == Kind.TIMED_OUT:
        return _timed_out_progressing(r, facts)
    notes = {(t.rank, t.pid if t.rank is None else None): t.note for t in ev.taken_stacks if t.note}
    detail, stuck = [], {}
    # the ranks something is known of (a heartbeat, a stack), and only ranks that exist: a rank
    # nothing is known of is not listed beside stacks of unknown rank that may be its own
    known = set(ev.last_heartbeat) | set(ev.stackdumps) | {t.rank for t in ev.taken_stacks if t.rank is not None}
    known |= {at.rank for at in d.ranks if d.kind in (Kind.LEFT, *FAILED)}  # a rank that left no file too
    for rank in sorted(k for k in known if k < r.world_size):
        line = f"rank {rank}: {last_heartbeat(r, rank)}"
        end = ended_before(r, rank)
        if end is not None or facts.no_rank_running:
            detail.append(f"{line}; no process left to take a stack of: it had ended" + (f" ({end})" if end else ""))
            continue
        detail.append(f"{line}; {_stack(f'rank {rank}', ev.stackdumps.get(rank), notes.get((rank, None)), stuck)}")
        # a rank's helpers are listed where the rank waits for them (its data loader's workers): idle in their
        # pool, a compiler's say nothing; harness_stacks/ holds every helper's dump
        waits = (dump := ev.stackdumps.get(rank)) is not None and dump.loader is not None
        detail += [f"rank {rank}'s helper pid {h.pid} (a process below it): {_stack('', h, None, {})}"
                   for h in ev.helper_stacks.get(rank, []) if waits]
    dumped = {dump.pid for dump in ev.unranked_stacks}
    for dump in ev.unranked_stacks:
        who = "rank unknown" + (f" (pid {dump.pid})" if dump.pid is not None else "")
        detail.append(f"{who}: {_stack(who, dump, notes.get((None, dump.pid)), stuck)}")
    for t in ev.taken_stacks:  # the harness tried and got no stack of its own
        if t.rank is None and t.pid not in dumped:
            who = f"rank unknown (pid {t.pid})"
            detail.append(f"{who}: {_stack(who, None, t.note, stuck)}")
    if not detail:
        detail.append("no heartbeats and no stack dumps were written")
    if 0 < len(stuck) < r.world_size:
        detail.append(f"stacks of {len(stuck)} of {r.world_size} ranks were recorded")
    kind = {Kind.HALT_STALL: "halt_stall", Kind.LEFT: "departed", Kind.CRASHED: "crash",
            Kind.KILLED: "crash", Kind.ABORTED: "aborted", Kind.QUIT: "quit",
            Kind.SILENT: "silent_rank", Kind.DIVERGED: "diverged", Kind.APART: "diverged",
            Kind.OUT_OF_STEP: "out_of_step", Kind.IMPORTING: "importing"}.get(d.kind, "stall")
    if d.kind == Kind.HALT_STALL:
        # the trainer's guard stopped the run first (the non-finite finding names the rank): what
        # stalled is its end, a rank that halted and stayed alive with the others waiting for it
        at = _after_halt(d, stuck)
        how = f"after the non-finite .HALT at step {ev.halt.step}, {how}"
    elif d.kind == Kind.LEFT:  # the rank that left is the cause; the others failed or waited after it
        gone = [x.rank for x in d.ranks]
        ended = [f"rank {k}: {end}" for k in sorted(ev.rank_failures) if k not in gone
                 and (end := ended_before(r, k)) is not None]
        rest = "; ".join(stuck.values()) or "no rank was left running"
        at = f": {departure(r, gone)}; {rest}" + (f" ({'; '.join(ended)})" if ended else "")
    elif d.kind in FAILED:  # it failed in its own right, and the others waited for it until the harness came
        root = d.rank
        signalled = {f"rank {k}" for k in ending(r)}  # in their end on the agent's signal, not waiting
        rest = "; ".join(v + (f" (ending: torchrun's agent had signalled it once rank {root} had failed)"
                              if who in signalled else "") for who, v in stuck.items())
        at = (f": rank {root} failed first ({d.cause}; {last_heartbeat(r, root)}), and the other ranks waited for "
              f"it" + (f": {rest}" if rest else ""))
        detail.insert(0, f"stderr: {d.logs[0]}")
    elif d.kind == Kind.SILENT:  # the others went on: none waited for it, whatever their stacks show
        at = f": {silenced(d)}"
    elif d.kind in (Kind.DIVERGED, Kind.APART):  # every rank waits in a collective, not all in one
        at = f": {went_apart(d)}"
    elif d.kind == Kind.IMPORTING:  # no rank in a collective: none waited for another
        at = f": {still_importing(d)}"
    elif d.kind == Kind.OUT_OF_STEP:  # left in a collective whose partner had completed the step and exited 0
        at = f": {out_of_step(d)}"
        facts = replace(facts, waiting=d.waiting, suspected=d.suspected)
    elif d.kind == Kind.HUNG and r.world_size > 1 and not _alone(r, d, stuck):
        at = _hung_first(r, d, stuck)
        facts = replace(facts, importing=any(x.importing is not None for x in d.ranks))
    else:
        at = (f": {'; '.join(stuck.values())}" if stuck
              else ": no rank started (no worker ran under any node's agent)"
              if facts.no_rank_started and facts.no_rank_running
              else ": no rank was left running to take a stack of"
              if facts.no_rank_running else ": no stack was recorded")
        if _alone(r, d, stuck):  # the one process left running: the others had ended, and it had not
            at = f": hung: {'; '.join(stuck.values())}; the other ranks had ended"
            facts = replace(facts, alone=True)
    if d.kind == Kind.HUNG:  # waiting for its data loader's workers, the rank or its one process
        facts = replace(facts, loader=any(x.workers is not None for x in d.ranks))
    # an attempt torchrun started the workers again after is no cause of this one's stall: said as earlier
    detail += _earlier_attempts(r)
    return Finding(Severity.CRITICAL, r.phase, f"stall in {where_run(r)} ({how}){at}", detail, kind, facts,
                   d if d.ranks and d.kind != Kind.HALT_STALL else None)


def _alone(r: PhaseRecord, d: Diagnosis, stuck: dict[str, str]) -> bool:
    """Of a run of several ranks: the diagnosis names as hung the one process the harness found
    running, the others having ended (its one rank, with a stack, the only one listed)."""
    return (r.world_size >= 2 and d.kind == Kind.HUNG and len(d.ranks) == 1 and len(stuck) == 1
            and d.ranks[0].no_stack is None and f"rank {d.rank}" in stuck)


def _after_halt(d: Diagnosis, stuck: dict[str, str]) -> str:
    """': rank 1 halted at step 3 and did not exit (in loop); still waiting: rank 0 in all_gather':
    the processes the harness found running after the trainer's non-finite .HALT, those that had
    halted (the diagnosis's ranks) apart from the others."""
    step, halted = d.step, [at.rank for at in d.ranks]
    first = [f"rank {k} halted at step {step} and did not exit"
             + (f" ({stuck[f'rank {k}'].removeprefix(f'rank {k} ')})" if f"rank {k}" in stuck else "") for k in halted]
    rest = [v for k, v in stuck.items() if not any(k == f"rank {h}" for h in halted)]
    if not first:
        return f": still running: {'; '.join(rest)}" if rest else ": no stack was recorded"
    return f": {'; '.join(first)}" + (f"; still waiting: {'; '.join(rest)}" if rest else "")


def _timed_out_progressing(r: PhaseRecord, facts: Facts) -> Finding:
    """A run the timeout stopped while its steps still came: slow, or a timeout too short for its
    steps; not a stall (the stacks say only where each rank happened to be)."""
    done = int(r.metrics.steps_completed or 0)
    of = f" of {r.steps}" if r.steps else ""
    title = (f"timed out in {where_run(r)} while still progressing: step {done}{of} logged, the last new step "
             f"{r.timeout_quiet_s:.1f}s before the {r.timeout_s:g}s timeout (not a stall): the trainer is slower than "
             "the phase's timeout_s allows for its steps")
    detail = [f"rank {k}: {last_heartbeat(r, k)}" for k in sorted(r.evidence.last_heartbeat) if k < r.world_size]
    return Finding(Severity.CRITICAL, r.phase, title, detail, "timeout", facts)


def _hung_first(r: PhaseRecord, d: Diagnosis, stuck: dict[str, str]) -> str:
    """': hung: rank 1 in f; waiting for it: rank 0 in g': the hung ranks the diagnosis names (by their
    stacks, or by their heartbeat where they have none) apart from those that waited for them."""
    first = [stuck[f"rank {at.rank}"] + importing_note(at) + workers_note(at) for at in d.ranks
             if at.no_stack is None] + [
        f"rank {at.rank} (no stack{'; its process stopped, by SIGSTOP or a debugger' if at.no_stack == NoStack.STOPPED else ''}; "
        f"{last_heartbeat(r, at.rank)})" for at in d.ranks if at.no_stack is not None]
    rest = [v for k, v in stuck.items() if k not in {f"rank {at.rank}" for at in d.ranks}]
    waiting = f"; waiting for {'it' if len(first) == 1 else 'them'}: {'; '.join(rest)}" if rest else ""
    return f": hung: {'; '.join(first)}{waiting}"


def _stack(who: str, dump: StackDump | None, note: str | None, stuck: dict[str, str]) -> str:
    """'stack (file): innermost <- outer frames [header]' for one process, adding where it was
    to ``stuck``; 'no stack dump' with the reason when there is none."""
    if dump and dump.frames:
        taken = "" if dump.source == "trainer" else f", {dump.source}"
        text = f"stack ({dump.path}{taken}): " + " <- ".join(
            f"{fr.func} ({short_path(fr.file)}:{fr.line})" for fr in dump.frames[:4])
        stuck[who] = f"{who} in {dump.frames[0].func}"
    else:
        text = "no stack dump"
    if dump and dump.header:
        text += f" [{dump.header}]"
    if note:
        text += f" [{note}]"
    return text


def imbalance(records: list[PhaseRecord]) -> list[Finding]:
    """Idle ranks, ranks of unequal step times and a straggler rank of each process: every repeat's."""
    out = []
    for r in processes(records):
        ev = r.evidence
        if r.timed_out or r.stalled_s is not None or r.exit_code not in (0, None) or r.status == Status.ERROR:
            # a crash or stall has its own finding; its ranks are not 'idle'. Nor are those of a run
            # whose files broke the contract (its finding names the file): a rank whose heartbeats
            # went into a file of a rank that does not exist has none of its own, and did work
            continue
        times = ev.rank_step_time_s
        gate = _imbalance_gate(r)  # a failed gate on the ratio makes the imbalance the point's critical finding
        if r.metrics.idle_ranks:
            detail, unwritten = [], [k for k in range(r.world_size or 1) if k not in ev.last_heartbeat]
            for rank in range(r.world_size or 1):
                hb = ev.last_heartbeat.get(rank)
                if hb is None:
                    detail.append(f"rank {rank}: {last_heartbeat(r, rank)}; the contract asks every rank for "
                                  f"{heartbeat_name(rank)}")
                    continue
                detail.append(f"rank {rank}: last step {_q(hb.step)}, stage {_q(hb.stage)}"
                              + (f", GPU util {hb.gpu_util:g}%" if hb.gpu_util is not None else "")
                              + (f", median step time {times[rank]:.3g}s" if rank in times else ""))
            if len(unwritten) >= r.metrics.idle_ranks:
                # idle by the metric for want of a record only: whether such a rank worked (a DDP rank in
                # every all-reduce did), its files cannot tell; that it wrote none breaks the contract
                files = "; ".join(f"{heartbeat_name(k)} {'has no record' if heartbeat_name(k) in ev.files else 'not written'}"
                                  for k in unwritten)
                out.append(Finding(Severity.CRITICAL, r.phase, (
                    f"{where_run(r)}: {_ranks(unwritten)} of {r.world_size} wrote no heartbeat ({files}), which the "
                    "contract asks of every rank: whether it did work, its files cannot tell"), detail, "artifacts",
                    Facts.of(r)))
                continue
            out.append(Finding(Severity.CRITICAL, r.phase, f"idle rank in {where_run(r)}: "
                               f"{int(r.metrics.idle_ranks)} of {r.world_size} rank(s) did no work", detail, "idle",
                               Facts.of(r)))
        elif len(times) >= 2 and min(times.values()) > 0 and (
                max(times.values()) / min(times.values()) > IMBALANCE_RATIO or gate):
            slow, fast = max(times, key=times.get), min(times, key=times.get)
            out.append(Finding(Severity.CRITICAL if gate else Severity.WARNING, r.phase, (
                f"rank imbalance in {where_run(r)}: rank {slow} takes {times[slow] / times[fast]:.1f}x as long per "
                f"step as rank {fast}" + (f"; gate {gate.text()}" if gate else "")),
                [f"rank {k}: median step time {v:.3g}s" for k, v in sorted(times.items())], "imbalance", Facts.of(r)))
        elif (late := _straggler_rank(r)) is not None:
            out.append(late)
    return out


class Waiting(enum.StrEnum):
    """What a straggler rank's heartbeats show of the other ranks waiting for it."""

    SHOWN = "shown"
    """Late to one stage of each step, it comes with the others to another (``Evidence.rank_nearest_s``
    under the bar): they met in a collective and waited for it there."""
    NOT_SHOWN = "not shown"
    """It is as late at every stage it reports: it runs that far behind at the others' pace, and
    nothing shows them waiting (ranks that meet in a collective leave it together)."""
    UNKNOWN = "unknown"
    """Its heartbeats report one stage a step that every rank shares (or the record is of an older
    harness): they cannot show whether the others wait."""


def _straggler_rank(r: PhaseRecord) -> Finding | None:
    """A rank of a one-node run that enters each step's stages late, by the node straggler's rule
    (findings/nodes.py): late by a quarter of the step and at least STRAGGLER_MIN_S, and the only rank
    so late. Every rank's step time is then about the same (else the imbalance finding speaks), which
    ranks that wait for it in a collective each step show, and so do ranks that share none and run
    that far apart: the finding says the others wait for it only where its heartbeats show it
    (``Waiting``), a possibility where they cannot tell, and is information where they show none."""
    late, times = r.evidence.rank_lateness_s, list(r.evidence.rank_step_time_s.values())
    if len(late) < 2 or not times or r.evidence.nodes is not None:
        return None
    step = sorted(times)[len(times) // 2]
    bar = max(STRAGGLER_MIN_S, STRAGGLER_SHARE * step)
    slow = [k for k, s in late.items() if s >= bar]
    if len(slow) != 1:
        return None
    [k] = slow
    near = r.evidence.rank_nearest_s.get(k)
    if near is None:
        waiting, said = Waiting.UNKNOWN, (
            "where the ranks meet in a collective each step (DDP's gradient all-reduce), the others wait for it there "
            "and the run goes at its pace; its heartbeats as recorded do not show whether they do (that takes two "
            "stages of each step that every rank reports)")
    elif near < bar:
        waiting, said = Waiting.SHOWN, (
            f"it comes with them to another stage of each step ({_ms(near)} after the earliest), so they wait for it "
            "there, in a collective, and every rank's step time is the same: the run goes at its pace")
    else:
        waiting, said = Waiting.NOT_SHOWN, (
            f"it is as late at every stage it reports (at least {_ms(near)}): it runs that far behind the other ranks "
            "at their pace, and nothing in the heartbeats shows them waiting for it (ranks that meet in a collective "
            "each step leave it together)")
    return Finding(Severity.INFO if waiting == Waiting.NOT_SHOWN else Severity.WARNING, r.phase, (
        f"straggler rank {k} in {where_run(r)}: it enters each step's stages {_ms(late[k])} after the earliest rank "
        f"({late[k] / step:.0%} of the {_ms(step)} step); {said}"),
        [f"rank {j}: {_ms(s)} behind the earliest rank, median step time {_ms(r.evidence.rank_step_time_s[j])}"
         if j in r.evidence.rank_step_time_s else f"rank {j}: {_ms(s)} behind the earliest rank"
         for j, s in sorted(late.items())], "straggler_rank", Facts.of(r))


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _imbalance_gate(r: PhaseRecord) -> GateResult | None:
    """The point's failed gate on the ranks' step-time ratio, which the imbalance finding states
    (failed_gates leaves it out); None where it has none or the idle-rank finding speaks instead."""
    if r.metrics.idle_ranks:
        return None
    return next((g for g in r.failed_gates() if g.metric == IMBALANCE_METRIC and g.verdict == GateVerdict.FAIL), None)


def artifact_errors(records: list[PhaseRecord]) -> list[Finding]:
    """A finding per ERROR process (every repeat's): a process that never ran (the launch failed,
    or the harness did) is said so, with its own kind, never as a trainer that broke its output
    contract; nor is a pytest or preflight point that ran (findings/checks.py)."""
    out = []
    for r in processes(records):
        if r.status != Status.ERROR:
            continue
        ev = r.evidence
        if ev.not_run == NotRun.LAUNCH:
            logs = [f"{r.out_dir}/{name}" for name in ev.files if name.endswith(".log")]
            out.append(Finding(Severity.CRITICAL, r.phase,
                               f"{where_run(r)} was not launched, nothing ran: {own_reason(r)}",
                               [f"the launcher's output: {', '.join(logs)}"] if logs else [],
                               "not_launched", Facts.of(r), rerun=r))
        elif ev.not_run == NotRun.HARNESS:
            out.append(Finding(Severity.CRITICAL, r.phase, f"{where_run(r)}: {own_reason(r)}",
                               [f"traceback: {r.out_dir}/{HARNESS_ERROR_FILE}"],
                               "harness_error", Facts.of(r), rerun=r))
        elif r.kind in TRAINER_KINDS:  # a pytest or preflight point has no output contract (findings/checks.py)
            out.append(Finding(Severity.CRITICAL, r.phase, f"{where_run(r)}: {own_reason(r)}", ev.errors[1:],
                               "artifacts", Facts.of(r)))
    return out


#: gates whose failure another detector already explains (idle ranks; a .HALT is a stall, a NaN or a
#: halt of the trainer's own)
_EXPLAINED = {"idle_ranks", "halt"}


def _golden_context(r: PhaseRecord) -> list[str]:
    """What tells a drift from the golden apart: the run's commit (the golden's is in the gate's
    note), and whether the point's repeats, where it has them, agree with each other."""
    out = [f"this run: the trainer at commit {short_commit(r.ran_at)}"] if r.ran_at else []
    agree = next((g for g in r.gates if g.metric == REPEAT_LOSS_METRIC and g.verdict == GateVerdict.PASS), None)
    if agree is not None:
        out.append(f"the point's repeats agree with each other ({agree.note}): this commit repeats itself, so its "
                   "numbers differ from those of the golden's commit")
    return out


def failed_gates(records: list[PhaseRecord]) -> list[Finding]:
    """Every gate that failed (or had no data) in a point whose process finished: one finding
    each, with the gate's meaning and where its numbers are; of a repeated point, every repeat's
    that ran clean, each named with its repeat (the record keeps the gates of one repeat only). In
    a run that stopped short, gates without data are explained by that finding; those that failed
    on a number still show."""
    out = []
    for r in records:
        if not r.ran or r.exit_code != 0 or r.evidence.halt is not None or r.status == Status.ERROR:
            own = []  # crashes, stalls, halts and contract violations have findings of their own
        else:
            nan = r.evidence.nonfinite_loss
            said = nan.text() if nan is not None else _first_nonfinite(r.evidence.nonfinite_loss_step)
            own = _gate_findings(r, r.failed_gates(), where_gated(r), r.out_dir, said,
                                 Outcome.of_record(r).stopped_short, kept=True, stated=_imbalance_gate(r))
        out += own
        for sub in r.runs:
            if not sub.name.startswith("repeat") or sub.out_dir == r.out_dir or sub.status != Status.FAIL:
                continue  # the record's own repeat is above; a repeat's failed process is no gate's finding
            if sub.exit_code != 0 or ".HALT" in sub.files or (sub.signs is not None and sub.signs.halted_nonfinite):
                continue
            if not sub.gates:  # a record of an older harness kept only the repeat's verdict: its reason says the gates
                out.append(Finding(Severity.CRITICAL, r.phase, f"gate failed in {where(r)}, {sub.label}: {sub.reason}",
                                   [f"CSV: {sub.out_dir}/training.csv"] if r.kind == "train" else [],
                                   "nonfinite" if sub.signs is not None and "loss_finite" in sub.signs.failed_gates
                                   else "gate", Facts.of(r)))
                continue
            failed = [g for g in sub.gates if g.verdict in (GateVerdict.FAIL, GateVerdict.NO_DATA)
                      and g.metric != REPEAT_LOSS_METRIC]  # the repeats' own gate is the point's, named above
            short = r.steps is not None and sub.last_step is not None and sub.last_step < r.steps
            # the imbalance finding states its gate, of a repeat that kept its evidence (imbalance: processes)
            stated = _imbalance_gate(process(r, sub)) if sub.evidence is not None else None
            out += _gate_findings(r, failed, f"{where(r)}, {sub.label}", sub.out_dir,
                                  _first_nonfinite(sub.signs.nonfinite_loss_step if sub.signs is not None else None),
                                  short, kept=False,
                                  stated=stated)
    return out


def _first_nonfinite(step: int | None) -> str | None:
    """The loss_finite gate's first line of a run whose record keeps the first non-finite step alone
    (another repeat's sub-record, a record of an older harness)."""
    return None if step is None else f"first non-finite loss logged at step {step}"


def _gate_findings(r: PhaseRecord, failed: list[GateResult], at: str, out_dir: str, nonfinite: str | None,
                   short: bool, kept: bool, stated: GateResult | None) -> list[Finding]:
    """The findings of one run's failed gates: of the run whose gates the record keeps (``kept``),
    else of another repeat of the point, in ``out_dir``, said to be ``at`` ('ab [default], repeat 2
    of 3'); ``stated``: its failed gate on the ranks' step-time ratio that its imbalance finding
    states (``_imbalance_gate``), None where that finding states none; ``nonfinite``: what its
    training.csv shows of its non-finite losses, the first line of a failed loss_finite gate."""
    out = []
    for g in (g for g in failed if g.metric not in _EXPLAINED):
        if short and g.verdict == GateVerdict.NO_DATA:
            continue
        if g.metric in stability.EXPLAINED and g.verdict == GateVerdict.FAIL:
            continue  # the spike or divergence finding (of every repeat) names the step and the value
        if g.metric in RESUME_METRICS:
            continue  # the resume finding names the first diverging step
        if g == stated:
            continue  # the imbalance finding names the slow rank and each rank's step time
        if g.overruled == Overruled.CLOCK:
            continue  # the clock finding names both clocks, the files and the gates it failed
        detail = [g.description] if g.description else []
        if g.metric == "loss_finite" and nonfinite is not None:
            detail.insert(0, nonfinite)
        if g.unsteady is not None:
            detail += g.unsteady.lines(heartbeat_files(out_dir, g.unsteady))
        if r.kind == "train":
            detail.append(f"CSV: {out_dir}/training.csv")
        pauses = r.metrics.gpu_host_pause_ms if kept else None
        if g.metric == "gpu_busy_frac" and pauses is not None:
            table = (f"; the profiler's tables: {r.out_dir}/{PROFILE_TOP_OPS}" if PROFILE_TOP_OPS in r.evidence.files
                     else "")
            detail.append(f"the GPU sat idle {pauses:.2f} ms a profiled step in gaps of 1 ms or more: the host "
                          f"pausing it (a sync, an optimizer's launches, loading data){table}")
        if g.metric == GOLDEN_METRIC:
            detail += _golden_context(r)
        # a non-finite loss, a golden's drift and repeats that differ have advice of their own;
        # the repeats' own gate is of all of them, any other the repeat's it failed in (named)
        kind = {"loss_finite": "nonfinite", GOLDEN_METRIC: "golden", REPEAT_LOSS_METRIC: "repeats"}.get(g.metric,
                                                                                                      "gate")
        title = f"gate failed in {where(r) if g.metric == REPEAT_LOSS_METRIC else at}: {g.text()}"
        if g.unsteady is None:
            out.append(Finding(Severity.CRITICAL, r.phase, title, detail, kind, Facts.of(r)))
            continue
        # slow steps whose time is not one stage's work: only a re-run of the point tells a one-off from the run's own
        rerun = r if set(g.unsteady.causes) - {Cause.STAGE} else None
        out.append(Finding(Severity.CRITICAL, r.phase, f"{title}; {g.unsteady.summary()}", detail, "unsteady",
                           replace(Facts.of(r), unsteady=g.unsteady), rerun=rerun))
    return out
