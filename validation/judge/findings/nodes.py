"""Findings about the nodes of a launch of several nodes (validation/judge/nodes.py): a node that
never joined the rendezvous, a node whose rank hung, a node whose rank was killed or failed (and
how the other nodes ended), a straggler node; and, for every such run, where each rank ran. Where
the run's diagnosis is of the ranks' collectives themselves (``COLLECTIVES``), no node failed of its
own, and where each rank ran says so instead."""
from __future__ import annotations

import re

from validation.contract.stacks import StackDump
from validation.contract.torchrun_log import gave_up, short_exception
from validation.judge.diagnosis.blame import Diagnosis, Kind
from validation.judge.diagnosis.collectives import hung_ranks
from validation.judge.diagnosis.crash import no_rank_started
from validation.judge.diagnosis.decide import diagnose
from validation.judge.diagnosis.failed import died_first, killed_by_signal, root_of_evidence
from validation.judge.diagnosis.left import departed, ended_before, exited_0, maybe_departed, unreported
from validation.judge.diagnosis.stall import failed_first, no_rank_running, stall
from validation.judge.findings.culprit import detected_by, who
from validation.judge.findings.departed import departure
from validation.judge.findings.finding import Finding, Severity, last_heartbeat, where
from validation.judge.nodes import NodeEvidence, NodesEvidence, killed_agent, signal_name
from validation.judge.record import PhaseRecord
from validation.excerpt import EXCERPT_CHARS

#: a node is a straggler when its ranks come this share of a step late (and at least STRAGGLER_MIN_S)
STRAGGLER_SHARE = 0.25
STRAGGLER_MIN_S = 0.05

#: diagnoses of the ranks' collectives themselves, one rank's not matching another's: the rank a check ended,
#: or left in a collective without a partner, is only where it showed, and its node did not fail
COLLECTIVES = (Kind.OUT_OF_STEP, Kind.MISMATCHED)

#: what stops a process, and how to see it
STOPPED_ADVICE = ("Find what stopped it: a SIGSTOP or SIGTSTP (`kill -STOP`, Ctrl-Z of a shell job, a tool or "
                  "script that pauses processes), a debugger or tracer attached to it (gdb, strace: TracerPid in "
                  "/proc/<pid>/status), or a frozen cgroup (a container paused with `docker pause`, a job its "
                  "scheduler suspended, such as Slurm's `scontrol suspend`; cgroup.freeze). `ps -o pid,stat,cmd` "
                  "shows it as T (stopped) or t (traced) while it lasts.")

NODE_ADVICE = {
    "node_missing": "A node never joined the rendezvous: read its log (named in the finding) for why its agent did not "
                    "start or reach the endpoint (host down, wrong endpoint, firewall, a broken environment on that "
                    "node); the other nodes gave up at the join timeout, as they should.",
    "node_stuck": "A node's torchrun agent was running but never completed the rendezvous, and said nothing of why: it "
                  "was stopped or stuck before any rank started, not down. Its process state (in the finding) says "
                  "which: 'stopped' is a SIGSTOP or SIGTSTP (kill -STOP, job control, a debugger holding it); "
                  "'disk-sleep' is I/O that does not return (a hung shared filesystem under its imports); otherwise "
                  "`py-spy dump --pid` of that host's agent while it waits shows where. A node that is only slow to "
                  "start needs a longer rdzv.join_timeout_s (and startup_s).",
    "node_unreachable": "A node's torchrun agent was running, not stopped, but never joined the rendezvous the other "
                        "nodes waited in until their join timeout: most likely it could not reach the endpoint (in the "
                        "finding). torchrun's agent tries to connect to the rendezvous's store for 60 s before its log "
                        "says so ('TCP client failed to connect/validate to host ... - retrying'; torch 2.13), so "
                        "within a shorter join timeout its log is silent. From that node, check that "
                        "the endpoint's host name resolves to the first node's address there (`getent hosts HOST`: no "
                        "127.x line for it in that node's /etc/hosts) and that the port is open between the nodes "
                        "(`python -c \"import socket; socket.create_connection(('HOST', PORT), 5)\"`; a firewall, a "
                        "security group; under Slurm the port is rdzv.port or one from the job id, 20000-28999). A node "
                        "only slow to start (imports on a slow shared filesystem) shows where it is in `py-spy dump "
                        "--pid` of its agent, and needs a longer rdzv.join_timeout_s (and startup_s).",
    "rendezvous_unanswered": "No node's torchrun agent got through the rendezvous, none gave up on it, and none was "
                             "stopped: each was still connecting to, or waiting on, the store at the endpoint (in the "
                             "finding), which never answered. torchrun's client waits 60 s for a connection before "
                             "its log says anything (torch 2.13). Look at the endpoint's port on "
                             "its host: another program holding it (`ss -ltnp` there: a listener that accepts and "
                             "never answers reads the same), a first node that is not the host the endpoint names, or "
                             "packets to it dropped (a firewall); then re-run.",
    "node_failed": "A rank on one node died first and the others failed in their collectives after it (or waited "
                   "for it until the harness stopped the run): read that node's log (named); SIGKILL with no traceback is usually the kernel's OOM killer (dmesg on that "
                   "host) or the scheduler.",
    "agent_killed": "A node's torchrun agent itself was killed (no rank failed on its own first): kill -9 of the agent, "
                    "the kernel's OOM killer on that host (dmesg there), the node going down, or the scheduler; its "
                    "workers, in sessions of their own, then break or are left without it. Read that node's log "
                    "(named) for what the agent said last.",
    "node_hung": "One node's rank stopped outside the collectives while the other nodes waited in them: its stack "
                 "(harness_stacks/) shows where; look at that host (I/O, a lock, a network interface) and at what "
                 "differs between the ranks' steps.",
    "node_hung_alone": "One node's rank did not end after the ranks of the other nodes had ended (the finding says "
                       "how each did): nothing waited for it in a collective. Its stack (harness_stacks/) shows where "
                       "it was once the others were done with it (a save, an evaluation or a teardown of its own, a "
                       "loop, a lock, I/O on that host); every rank must end after its last step.",
    "node_frozen": "One node's rank was a stopped process when the harness came for its stack (the finding names it), "
                   "and the other nodes waited for it in their collectives: it ran nothing, so it has no stack and "
                   "nothing in the ranks' steps diverged. On that host: " + STOPPED_ADVICE[0].lower()
                   + STOPPED_ADVICE[1:],
    "slurm_stopped": "Slurm ended the job step without the harness asking: someone's scancel of the job or the step, "
                     "the job's time limit (srun_args --time, or the partition's), preemption or a node failure; "
                     "slurmstepd's line in the finding says which. The trainer did not fail: re-run the point "
                     "(with a longer --time where the time limit ended it).",
    "straggler": "One node is slower and every other node waits for it: compare that host's load, clocks, data "
                 "access and GPU health (preflight), or move the job off it.",
}


def nodes(records: list[PhaseRecord]) -> list[Finding]:
    out = []
    for r in records:
        ev = r.evidence.nodes
        if ev is None:
            continue
        d = diagnose(r)
        # a node finding would blame the node of the rank a check ended (gloo's aborts it: 'killed by SIGABRT')
        # or left without a partner, where the ranks' collectives were at fault
        # a rank out of step by its heartbeat alone (no stack) may have hung of its own there: its node's finding
        collectives = d if d is not None and d.kind in COLLECTIVES and not d.suspected else None
        first = None if collectives else (_slurm_stopped(r, ev) or missing_node(r, ev) or _departed(r, ev)
                                          or _hung(r, ev) or _failed(r, ev) or _agent_killed(r, ev))
        found = ([first] if first else []) + _stragglers(r, ev)
        # each finding lists every node; a run without one still says where each rank ran
        title = _summary(r, ev) + (f"; {_collectives(collectives)}" if collectives else "")
        out += found or [Finding(Severity.INFO, r.phase, title, _lines(r, ev), "nodes")]
    return out


def _collectives(d: Diagnosis) -> str:
    """A diagnosis of the ranks' collectives (``COLLECTIVES``) in the nodes' terms: "no node failed of its own:
    the ranks' collectives did not match across the nodes: gloo's check of a message's size aborted node 0's rank
    0, where the mismatch was detected"; "...: the ranks' collectives were out of step across the nodes: node 1's
    rank 1 failed in a collective during step 6, a step node 0's rank 0 had completed before it exited 0"."""
    if d.kind == Kind.MISMATCHED:
        return (f"no node failed of its own: the ranks' collectives did not match across the nodes: {detected_by(d)}, "
                "where the mismatch was detected")
    did = "waited in a collective, with no partner left," if d.waiting else "failed in a collective"
    steps = sorted({at.step for at in d.ranks if at.step is not None})
    within = f"during step {steps[0]}, a step" if len(steps) == 1 else "within steps"
    return ("no node failed of its own: the ranks' collectives were out of step across the nodes: "
            f"{', '.join(map(who, d.ranks))} {did} {within} {', '.join(map(who, d.ended))} had completed before "
            f"{'it' if len(d.ended) == 1 else 'they'} exited 0")


def _summary(r: PhaseRecord, ev: NodesEvidence) -> str:
    job = f", Slurm job {ev.slurm_job_id}" if ev.slurm_job_id else ""
    count = f"{len(ev.nodes)} node{'s' if len(ev.nodes) != 1 else ''}"
    return (f"{count} in {where(r)}: {ev.launcher}, c10d rendezvous at {ev.rdzv_endpoint}, join timeout "
            f"{ev.join_timeout_s:g} s{job}")


def _lines(r: PhaseRecord, ev: NodesEvidence) -> list[str]:
    """A line per node: where it ran, its ranks (last heartbeat, how each ended), how long their steps took and how
    late they came (``_timing``), its agent."""
    out, apart = [], _out_of_step(r)
    for n in ev.nodes:
        place = ", ".join(x for x in (f"host {n.host}" if n.host else "",
                                      f"GPUs {n.devices}" if n.devices is not None else "",
                                      f"torchrun node rank {n.group_rank}" if n.group_rank is not None else "",
                                      f"log {n.log}") if x)
        ranks = "; ".join(_rank(r, rank) for rank in n.ranks) or "no rank ran"
        timing = _timing(n, len(ev.nodes), apart)
        told = any((f := r.evidence.rank_failures.get(k)) is not None and f.unranked == n.worker_said for k in n.ranks)
        worker = (f"; a worker's traceback in its log, naming no rank: {_said(n.worker_said)}"
                  if n.worker_said and not told else "")  # not twice where its rank's end already says it
        out.append(f"node {n.index} ({place}): {ranks}{timing}; agent {_agent(n, _agent_stopped(r, ev, n))}{worker}")
    return out


def _out_of_step(r: PhaseRecord) -> Diagnosis | None:
    """The run's diagnosis of ranks whose collectives were out of step (Kind.OUT_OF_STEP, or beside an early exit,
    ``Diagnosis.beside``); None where it is none."""
    d = diagnose(r)
    off = d.beside if d is not None and d.beside is not None else d
    return off if off is not None and off.kind == Kind.OUT_OF_STEP else None


def _timing(n: NodeEvidence, nodes: int, apart: Diagnosis | None) -> str:
    """'; median step 51.5 ms, 0.134 ms behind the earliest rank': how long a node's ranks' steps took, and how late
    they entered each step's stages beside the other nodes' (judge/nodes.py ``lateness``); of one node, nothing of
    lateness (the judge records none for one node now: records stored before carry one). Where the ranks'
    collectives were out of step (``apart``), that delay is no lateness: from the step they went out of step on, one
    rank's collectives met the others' of a later step, so the ranks' heartbeats of one step number were of
    different steps, and the delay is a step's; it is said for what it is (what it may be, where out of step is
    only suspected)."""
    out = f"; median step {_ms(n.step_time_s)}" if n.step_time_s is not None else ""
    if n.lateness_s is None or nodes < 2:
        return out
    late = f"{_ms(n.lateness_s)} after the earliest rank's heartbeats of the same step number"
    if apart is None:
        return out + f", {_ms(n.lateness_s)} behind the earliest rank"
    if apart.suspected:
        return (out + f", {late}: lateness, or, if the ranks' collectives were out of step, no lateness but a step "
                "number naming different steps on different ranks")
    return (out + f", {late}, which is no lateness: the ranks' collectives were out of step, so a step number named "
            "different steps on different ranks")


def _rank(r: PhaseRecord, rank: int) -> str:
    f = r.evidence.rank_failures.get(rank)
    text = f"rank {rank} {last_heartbeat(r, rank)}"
    if f is not None and f.cause:
        text += f", {f.cause}"
    elif rank in exited_0(r):
        text += ", exited 0"
    elif rank in unreported(r):
        text += ", its end not reported (its torchrun agent was killed)"
    return text


def _agent_stopped(r: PhaseRecord, ev: NodesEvidence, n: NodeEvidence) -> bool:
    """Whether an agent without an exit code is one the harness stopped still running: on this host
    always (the harness sees every agent it started end; it stops the others also when one failed
    and no rank was left under them), under Slurm (srun says only which tasks failed) when the
    harness stopped the run, or the harness saw the agent's process running here as it did (its
    process state is recorded)."""
    return ev.launcher == "torchrun" or r.stopped_by_harness or n.state is not None


def _agent(n: NodeEvidence, stopped: bool) -> str:
    if n.exit_code is None:
        ended = f"still running{_state(n)} when the harness stopped the run" if stopped else "end not known"
    else:
        ended = f"exit {n.exit_code}" + (f" after {n.ended_s:.1f} s" if n.ended_s is not None else "")
    return ended + (f" ({_said(n.said)})" if n.said else "")


def _slurm_stopped(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """Slurm ended the step without the harness asking (scancel by someone else, the job's time
    limit, preemption): every rank was stopped, none failed in its own right."""
    if ev.slurm_stopped is None or r.exit_code in (0, None):
        return None
    done = int(r.metrics.steps_completed or 0)
    at = f"after step {done}" + (f" of {r.steps}" if r.steps else "") if done else "before their first step"
    title = (f"Slurm ended the step in {where(r)}, not the trainer and not the harness: {ev.slurm_stopped}; the "
             f"ranks were stopped {at}")
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "slurm_stopped")


def missing_node(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """No rank ran anywhere, and some agents gave up on the rendezvous: those that did not are
    the nodes that never joined; an agent of them still running when the harness stopped the run
    (it does once the rendezvous is closed for good, validation/launch/process.py) was not down:
    held before it (stopped, traced, in I/O: kind ``node_stuck``), else waiting, most likely unable
    to reach the endpoint (kind ``node_unreachable``). Where no agent gave up before the harness
    stopped the run, ``_never_met``."""
    if not no_rank_started(r):  # the diagnosis's own test (validation/judge/diagnosis/crash.py)
        return None
    waited = [n for n in ev.nodes if gave_up(n.said)]
    if not waited:
        return _never_met(r, ev)
    missing = [n for n in ev.nodes if n not in waited]
    gave = ", ".join(n.name + (f" after {n.ended_s:.1f} s" if n.ended_s is not None else "") for n in waited)
    why = sorted({gave_up(n.said) for n in waited})
    who = (f"{_names(missing)} never joined the rendezvous" if missing
           else f"a node never joined the rendezvous (all {len(waited)} that started waited)")
    title = (f"{who} in {where(r)}: no rank started; the others gave up waiting (join timeout "
             f"{ev.join_timeout_s:g} s): {gave}, {', '.join(why)}")
    alive = [n for n in missing if n.exit_code is None and _agent_stopped(r, ev, n)]
    # an agent held (stopped, traced, in I/O that does not return) is stuck; one that waits running
    # most likely cannot reach the endpoint: torchrun's client retries its connection silently
    stuck = [n for n in alive if n.state in _HELD]
    if alive:
        title += "; " + "; ".join(f"{n.name}'s agent was still running{_state(n)} and {_log_said(n)} when the harness "
                                  "stopped it" for n in alive)
        if not stuck:
            title += f" (the rendezvous: {ev.rdzv_endpoint})"
    detail = [f"{n.name} never joined: its agent {_agent(n, _agent_stopped(r, ev, n))}; log {n.log}"
              + ("" if n.said else " (empty)") for n in missing]
    kind = "node_missing" if not alive else "node_stuck" if stuck else "node_unreachable"
    return Finding(Severity.CRITICAL, r.phase, title, detail + _lines(r, ev), kind)


#: process states of an agent that something holds (psutil's names): it runs nothing of its own
_HELD = ("stopped", "tracing-stop", "disk-sleep")


def _never_met(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """The harness stopped a run (its start-up allowance, or the timeout) in which no rank started
    and no agent gave up on the rendezvous: the agents were still meeting, or waiting on one that
    holds the rendezvous's store. An agent whose process was stopped (SIGSTOP, a debugger) while
    the others' were not is the one they waited for, and is named; else none is, and where none
    was held the endpoint never answered them (kind ``rendezvous_unanswered``)."""
    if not r.stopped_by_harness or r.evidence.rank_failures or not ev.nodes:
        return None
    frozen = [n for n in ev.nodes if n.exit_code is None and n.state == "stopped"]
    how = (f"no rank started in the {r.stalled_s:.0f} s before the harness stopped the run" if r.stalled_s is not None
           else f"no rank started before the {r.timeout_s:g} s timeout")
    agents = "; ".join(f"{n.name}: agent {_agent(n, True)}" for n in ev.nodes)
    if frozen and len(frozen) < len(ev.nodes):
        title = (f"{_names(frozen)} held up the rendezvous in {where(r)}: its torchrun agent was stopped (process "
                 f"state stopped); {how} (join timeout {ev.join_timeout_s:g} s); {agents}")
        return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "node_stuck")
    title = (f"the nodes never completed the rendezvous at {ev.rdzv_endpoint} in {where(r)}: {how}, and no agent gave "
             f"up on it (join timeout {ev.join_timeout_s:g} s); {agents}")
    # every agent held alike says nothing of the endpoint; agents all waiting running got no answer from it
    held = any(n.exit_code is None and n.state in _HELD for n in ev.nodes)
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "node_stuck" if held else "rendezvous_unanswered")


def _state(n: NodeEvidence) -> str:
    return f" (process state {n.state})" if n.state else ""


def _log_said(n: NodeEvidence) -> str:
    return f"its log's last word was {_said(n.said)}" if n.said else "had written nothing in its log"


def _hung(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """A stalled run (the harness's stall watch or timeout, or the trainer's own watchdog): the
    hung ranks (judge/diagnosis/collectives.py ``hung_ranks``) and their nodes; the others waited for them."""
    if len(ev.nodes) < 2:
        return None  # no other node waited: the stall finding says which rank hung, as for any one-node launch
    watchdog = r.evidence.halt is not None and r.evidence.halt.source == "watchdog"
    if r.stalled_s is None and not r.timed_out and not watchdog or died_first(r) is not None:
        return None  # no stall, or a rank died and the watchdog fired in those waiting for it (_failed)
    if r.progressing_at_timeout:
        return None  # nothing hung: its steps still came when the timeout stopped it (findings/failures.py)
    if r.evidence.halt is not None and r.evidence.halt.source == "nonfinite":
        return None  # the trainer halted on a non-finite loss first: what stalled is its end (findings/failures.py)
    if failed_first(r) is not None:
        return None  # a rank had failed in its own right and the others waited for it (_failed)
    if r.evidence.silent_ranks:
        return None  # a rank hung while the others went on, not waiting for it: the stall finding names it and its node
    if no_rank_running(r):
        return None  # nothing hung: every rank had ended (or never started), a launcher kept the run open
    if (d := stall(r)) is not None and d.kind in (Kind.DIVERGED, Kind.APART):
        return None  # every rank waits in a collective, not all in one: the stall finding names each with its node
    # a rank that had ended (exit 0, or a failure of its own) neither hung nor waited
    ended = {k: e for k in sorted(set(r.evidence.stackdumps) | set(r.evidence.last_heartbeat))
             if (e := ended_before(r, k)) is not None}
    stacks = {k: d for k, d in r.evidence.stackdumps.items() if k not in ended}
    beats = {k: b for k, b in r.evidence.last_heartbeat.items() if k not in ended}
    ranks = sorted(set(stacks) | set(beats))
    if not ranks:
        return None
    hung = hung_ranks(stacks, beats)
    if not hung:
        return None
    how = (f"no progress for {r.stalled_s:.0f} s" if r.stalled_s is not None
           else f"the {r.timeout_s:g} s timeout" if r.timed_out else "the trainer's watchdog .HALT")
    stopped = {t.rank for t in r.evidence.taken_stacks if t.state == "stopped" and t.rank is not None}
    frozen = [k for k in hung if k in stopped and not (stacks.get(k) and stacks[k].frames)]
    stuck = "; ".join(f"{_on(ev, k)}rank {k} {_where(stacks.get(k), beats.get(k), k in frozen)}" for k in hung)
    waiting = [k for k in ranks if k not in hung]
    others = "; ".join(f"{_on(ev, k)}rank {k} {_where(stacks.get(k), beats.get(k))}" for k in waiting)
    nodes_hung = {ev.of_rank(k).index for k in hung if ev.of_rank(k) is not None}
    head = _names([n for n in ev.nodes if n.index in nodes_hung]) or "a node"
    gone = "; ".join(f"{_on(ev, k)}rank {k} ({e})" for k, e in ended.items())
    title = (f"{head} hung in {where(r)} ({how}): {stuck}" + (f"; waiting for it: {others}" if others else "")
             + (f"; already ended: {gone}" if gone else ""))
    # with no rank left waiting in a collective, the hung ones outlived the others' ends
    kind = ("node_frozen" if frozen and len(frozen) == len(hung) else "node_hung_alone" if gone and not waiting
            else "node_hung")
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), kind)


def _failed(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """A run that ended with a failure: the rank that failed in its own right (killed by a signal
    other than torchrun's SIGTERM, or an exception that is not a peer's collective breaking),
    its node, and how every other node ended."""
    if r.exit_code in (0, None) and failed_first(r) is None:
        return None  # a failure ends the run, or the others waited for it until the harness stopped it
    failures = r.evidence.rank_failures
    root = root_of_evidence(r.evidence)
    if root is None:
        return None
    f = failures[root]
    node = ev.of_rank(root)
    cause = (f"was killed by {f.signal}" if killed_by_signal(r) == root
             else f"failed: {short_exception(f.exception) if f.exception else f.cause}")
    ended = _others(r, ev, node)
    head = f"{node.name}'s rank {root}" if node is not None else f"rank {root} (node unknown)"
    # a silent exit may be a rank catching its collective broken by one that left (findings/departed.py)
    maybe = "".join(f", or {_on(ev, k)}{departure(r, [k])} and it failed after it" for k in maybe_departed(r))
    title = (f"{head} {cause} in {where(r)}" + (f" (log {node.log})" if node is not None else "")
             + (f"{maybe}: which came first cannot be told" if maybe else "")
             + (f"; the other nodes: {ended}" if ended else ""))
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "node_failed")


def _departed(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """A rank that exited 0 early (findings/departed.py), its node, and how every other node ended:
    the others failed in their collectives after it, or waited for it (its own agent, its workers
    done, waits for the other nodes at torchrun's exit barrier)."""
    gone = departed(r)
    if not gone:
        return None
    nodes_gone = [n for n in ev.nodes if any(k in n.ranks for k in gone)]
    ended = "; ".join(f"{n.name}: " + (", ".join(_rank(r, k) for k in n.ranks if k not in gone) or "no other rank")
                      + f", agent {_agent(n, _agent_stopped(r, ev, n))}" for n in ev.nodes)
    head = "; ".join(f"{_on(ev, k)}{departure(r, [k])}" for k in gone)
    logs = ", ".join(n.log for n in nodes_gone)
    title = f"{head} in {where(r)}" + (f" (log {logs})" if logs else "") + f"; the nodes: {ended}"
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "departed")


def _agent_killed(r: PhaseRecord, ev: NodesEvidence) -> Finding | None:
    """No rank failed in its own right, but a node's torchrun agent was killed by a signal
    (``killed_agent``): its worker, in a session of its own, lives on and breaks later or finishes
    while the other agents wait on a store gone with it, so the run ends in a peer's error, a stall,
    or the harness ending the agents left waiting."""
    node = killed_agent(ev.launcher, ev.nodes, r.stopped_by_harness)
    if node is None:
        return None
    after = f" after {node.ended_s:.1f} s" if node.ended_s is not None else ""
    ended = _others(r, ev, node)
    title = (f"{node.name}'s torchrun agent was killed by {signal_name(-node.exit_code)} in {where(r)}{after} "
             f"(log {node.log})" + (f"; the other nodes: {ended}" if ended else ""))
    return Finding(Severity.CRITICAL, r.phase, title, _lines(r, ev), "agent_killed")


def _others(r: PhaseRecord, ev: NodesEvidence, node: NodeEvidence | None) -> str:
    """How every node but ``node`` ended: its ranks and its agent."""
    return "; ".join(f"{n.name}: " + (", ".join(_rank(r, k) for k in n.ranks) or "no rank")
                     + f", agent {_agent(n, _agent_stopped(r, ev, n))}" for n in ev.nodes if n is not node)


def _stragglers(r: PhaseRecord, ev: NodesEvidence) -> list[Finding]:
    """Nodes whose ranks come late to each step, in a run that finished."""
    times = list(r.evidence.rank_step_time_s.values())
    late = [n for n in ev.nodes if n.lateness_s is not None]
    if r.exit_code != 0 or r.stalled_s is not None or not times or len(late) < 2:
        return []
    step = sorted(times)[len(times) // 2]
    bar = max(STRAGGLER_MIN_S, STRAGGLER_SHARE * step)
    out = []
    for n in late:
        if n.lateness_s >= bar and all(o.lateness_s < bar for o in late if o is not n):
            out.append(Finding(Severity.WARNING, r.phase, (
                f"straggler {n.name} in {where(r)}: its rank(s) {', '.join(map(str, n.ranks))} enter each step's "
                f"stages {_ms(n.lateness_s)} after the earliest rank ({n.lateness_s / step:.0%} of the {_ms(step)} "
                f"step); the other nodes wait for it"), _lines(r, ev), "straggler"))
    return out


def _where(dump: StackDump | None, beat, stopped: bool = False) -> str:
    at = (f"in {dump.frames[0].func}" if dump and dump.frames
          else "(stopped, no stack: its process was stopped when the harness came for it)" if stopped else "(no stack)")
    step = f" (last heartbeat step {beat.step}, {beat.stage})" if beat is not None and beat.step is not None else ""
    return at + step


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _on(ev: NodesEvidence, rank: int) -> str:
    node = ev.of_rank(rank)
    return f"{node.name}'s " if node is not None else ""


def _names(nodes: list[NodeEvidence]) -> str:
    return ", ".join(n.name for n in nodes)


def _said(text: str) -> str:
    """An agent's error as its class name and message: 'RendezvousTimeoutError'."""
    m = re.match(r"^(?:[A-Za-z_][\w]*\.)*(?P<name>[A-Za-z_]\w*(Error|Exception|Failure))\b:?\s*(?P<msg>.*)$", text)
    if m is None:
        return repr(text[:EXCERPT_CHARS])
    return m["name"] + (f": {m['msg'][:EXCERPT_CHARS]}" if m["msg"] else "")
