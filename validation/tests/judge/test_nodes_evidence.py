"""Two-node Slurm runs read back from the files they left (validation/tests/evidence/, each
directory a run's nodes.json, agent logs and, where they matter, heartbeats): what the judge makes
of each node. Recorded 2026-11-28 on the two-node single-host Slurm (scripts/slurm/single_host.sh,
SLURM_SH_NODES=2), the trainer nsa.train --config tiny, 2 nodes x 1 process:

- slurm_busy_port: rdzv.port 24999 held by a listener that accepts and never answers; neither
  agent got through the rendezvous, the start-up allowance (30 s) ended the run, and the harness
  cancelled the step (scancel --signal=TERM), which left slurmstepd's banner in node0.stderr.log.
- slurm_netns_fqdn: node 1's slurmd in a network namespace of its own (veth 10.200.0.1 <->
  10.200.0.2, /etc/hosts of its own, UTS host name vmn1.s13.test); a healthy run.
- slurm_netns_blocked_port: the same, with node 1's connections to 10.200.0.1:20000-28999
  rejected (iptables in its namespace): node 1 never reached the rendezvous; node 0 gave up at
  the join timeout (15 s).
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from validation.contract.files import read_heartbeats
from validation.contract.nodes import read_nodes, write_nodes
from validation.contract.torchrun_log import agent_said
from validation.judge.findings import Severity, find, recommendations
from validation.judge.nodes import node_evidence
from validation.judge.record import Evidence, PhaseRecord, PointKey, Status

EVIDENCE = Path(__file__).parents[1] / "evidence"


def test_slurmstepds_cancel_banner_is_not_what_the_agent_said():
    """The harness's own cancel of a step whose agents never started a worker left only
    slurmstepd's line in node 0's log; the nodes finding quoted it as the agent's last word:
    "node 0: agent still running (process state sleeping) when the harness stopped the run
    ('slurmstepd-vmn0: error: *** STEP 7.1 ON vmn0 CANCELLED AT ... ***')". Slurm wrote it, not
    torchrun's agent: the agent said nothing."""
    run = EVIDENCE / "slurm_busy_port"
    assert "*** STEP 7.1 ON vmn0 CANCELLED AT" in (run / "node0.stderr.log").read_text()  # the evidence is as said
    assert agent_said(run / "node0.stderr.log") is None
    ev = node_evidence(run, {}, {})
    assert [n.said for n in ev.nodes] == [None, None], ev.nodes


def _as_if_remote(run: Path, tmp_path: Path, node: int) -> Path:
    """A copy of ``run`` whose nodes.json has none of ``node``'s ranks, node rank or agent: what the
    harness records of a node on another host, whose processes it cannot see (on the single-host
    Slurm every node's processes are visible here, and found by the run's token)."""
    out = tmp_path / run.name
    shutil.copytree(run, out)
    launch = read_nodes(out)
    launch.nodes[node] = dataclasses.replace(launch.nodes[node], pid=None, group_rank=None, ranks={})
    write_nodes(out, launch)
    return out


def test_a_rank_on_a_host_whose_name_is_a_fqdn_is_placed_on_its_node(tmp_path):
    """Slurm's check of the shared run directory records each node's ``hostname --short``
    ('vmn1'); the trainer's heartbeats carry ``socket.gethostname()``, which is the whole name where
    a host's name is a FQDN ('vmn1.s13.test', node 1's UTS name here). Where the harness cannot see
    a node's processes (a cluster: they run on another host) the host is all that places its
    ranks, and rank 1 was on no node ('no rank ran' of node 1, and a fault of rank 1 named no
    node)."""
    run = EVIDENCE / "slurm_netns_fqdn"
    launch = read_nodes(run)
    beats = read_heartbeats(run)
    assert [n.host for n in launch.nodes] == ["vm", "vmn1"], launch  # the evidence is as said
    assert {r["host"] for r in beats[1]} == {"vmn1.s13.test"}
    assert [n.ranks for n in node_evidence(run, beats, {}).nodes] == [[0], [1]]  # seen here: placed by pid
    remote = _as_if_remote(run, tmp_path, node=1)
    assert [n.ranks for n in node_evidence(remote, read_heartbeats(remote), {}).nodes] == [[0], [1]]


def test_a_node_that_cannot_reach_the_rendezvous_is_told_so_not_that_it_was_stopped():
    """Node 1's connections to the first node's rendezvous port were rejected (a firewall between
    the nodes): its agent, running and sleeping, said nothing but a c10d warning in the 15 s node 0
    waited (torchrun's client tries to connect for 60 s, then says 'TCP client failed to
    connect/validate to host 10.200.0.1:24500 - retrying', measured here). The advice read 'said
    nothing of why: it was stopped or stuck before any rank started, not down' and sent the engineer
    to SIGSTOP, a debugger and disk I/O; the likeliest cause of an agent that waits running, not
    reaching the endpoint, went unsaid, and the finding did not say where the endpoint was."""
    run = EVIDENCE / "slurm_netns_blocked_port"
    ev = node_evidence(run, {}, {})
    assert ev.rdzv_endpoint == "vmn0:20014" and [n.state for n in ev.nodes] == [None, "sleeping"], ev
    rec = PhaseRecord(key=PointKey("slurm2", "cpu", "healthy"), test_id="slurm2/cpu/healthy/default", kind="train",
                      status=Status.FAIL, reason="trainer ended before its first step (exit code 1)", exit_code=1,
                      world_size=2, evidence=Evidence(nodes=ev))
    [f] = [f for f in find([rec]) if f.severity == Severity.CRITICAL]
    assert f.title.startswith("node 1 never joined the rendezvous in healthy [default]: no rank started; the others "
                              "gave up waiting (join timeout 15 s): node 0, RendezvousTimeoutError; node 1's agent was "
                              "still running (process state sleeping)"), f.title
    assert f.title.endswith(" when the harness stopped it (the rendezvous: vmn0:20014)"), f.title
    [advice] = recommendations([f])
    assert "reach" in advice and "stopped or stuck" not in advice, advice
    assert "60 s" in advice, advice
    # an agent stopped (SIGSTOP) before the rendezvous keeps its own advice
    frozen = dataclasses.replace(ev, nodes=[ev.nodes[0], dataclasses.replace(ev.nodes[1], state="stopped")])
    [f] = [f for f in find([dataclasses.replace(rec, evidence=Evidence(nodes=frozen))])
           if f.severity == Severity.CRITICAL]
    assert f.kind == "node_stuck" and "'stopped' is a SIGSTOP" in recommendations([f])[0], f


def test_agents_that_never_got_an_answer_from_the_rendezvous_are_told_to_check_the_endpoint():
    """rdzv.port 24999 was held by another program (a listener that accepts and never answers):
    both agents waited on it, running, neither gave up, and the start-up allowance ended the run.
    The advice was the stuck-agent one ('said nothing of why: it was stopped or stuck ...',
    SIGSTOP, debuggers, disk I/O), and no finding said where the rendezvous was."""
    run = EVIDENCE / "slurm_busy_port"
    ev = node_evidence(run, {}, {})
    assert [n.state for n in ev.nodes] == ["sleeping", "sleeping"], ev  # the evidence is as said
    rec = PhaseRecord(key=PointKey("slurm2b", "cpu", "busy_port"), test_id="slurm2b/cpu/busy_port/default",
                      kind="train", status=Status.FAIL, reason="stalled", exit_code=None, world_size=2, stalled_s=30.0,
                      evidence=Evidence(nodes=ev))
    [f] = [f for f in find([rec]) if f.kind.startswith("node") or f.kind.startswith("rendezvous")]
    assert f.title.startswith("the nodes never completed the rendezvous at vmn0:24999 in busy_port [default]: no rank "
                              "started in the 30 s before the harness stopped the run, and no agent gave up on it"), \
        f.title
    [advice] = recommendations([f])
    assert "stopped or stuck" not in advice and "24999" not in advice and "answer" in advice, advice
