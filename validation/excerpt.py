"""How much of a trainer's text the harness quotes: a line of a log, a .HALT record, a stack's
message or an error cut to one width wherever a message or a finding quotes it (the whole text
stays in its file, which the message names), and the lines of a stderr tail."""
from __future__ import annotations

#: characters of one quoted line
EXCERPT_CHARS = 200
#: lines of a process's stderr shown at its end
STDERR_TAIL_LINES = 40
