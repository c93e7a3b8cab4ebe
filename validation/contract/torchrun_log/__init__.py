"""How each rank of a torchrun launch ended, and what its agent itself last said, read from
torchrun's own log (its stderr).

Its modules, each importing only those listed before it:

* patterns.py: what the log's lines look like, where more than one module reads them, and reading
  a log's tail;
* exceptions.py: exceptions and tracebacks as the log prints them;
* whose.py: whose each line is, the agent's or a worker's, and what the agent says it signalled;
* failure.py: how one rank ended (``RankFailure``), and what that says of it;
* attempts.py: the attempts of the workers under ``--max-restarts``: how each ended, and the last;
* ranks.py: how each rank ended (``rank_failures``);
* said.py: what a whole log says of its last attempt: the agent's last word, a worker's exception
  that names no rank, the last exception, the processes the agent signalled.
"""
from __future__ import annotations

from validation.contract.torchrun_log.attempts import AgentSeen, AttemptEnd, attempt_ends, last_attempt
from validation.contract.torchrun_log.exceptions import has_traceback, last_exception, short_exception
from validation.contract.torchrun_log.failure import RankFailure
from validation.contract.torchrun_log.ranks import rank_failures
from validation.contract.torchrun_log.said import (agent_said, agent_signalled, agent_stopped, closed_rendezvous,
                                                   gave_up, log_exception, log_has_traceback, worker_said)
from validation.contract.torchrun_log.whose import whose_lines

__all__ = ["AgentSeen", "AttemptEnd", "RankFailure", "agent_said", "agent_signalled", "agent_stopped", "attempt_ends",
           "closed_rendezvous", "gave_up", "has_traceback", "last_attempt", "last_exception", "log_exception",
           "log_has_traceback", "rank_failures", "short_exception", "whose_lines", "worker_said"]
