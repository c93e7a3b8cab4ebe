"""Exceptions and tracebacks as a torchrun log prints them: an exception in short, the last one
of a text, whether it holds a trainer's traceback, and a rank's traceback with the frame of the
trainer's own code that raised."""
from __future__ import annotations

import io
import re
import tokenize

from validation.contract.stacks import Frame, collective_of
from validation.contract.torchrun_log.patterns import RANK_LINE, TRACEBACK
from validation.excerpt import EXCERPT_CHARS, STDERR_TAIL_LINES

#: torchrun's own report that a worker failed (its agent's traceback, last in its log): it says
#: nothing of why
_CHILD_FAILED = "ChildFailedError"
#: a line that looks like an error where no traceback says one: an exception's ('OSError: ...'), a
#: trainer's own one-line error ('error: ...', '[rank 0] error at step 6: ...'), its rank prefix dropped,
#: or argparse's refusal of a command line ('train.py: error: unrecognized arguments: --bogus 1')
_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception|Interrupt)|RuntimeError|AssertionError)\b.*")
_SAID_ERROR = re.compile(r"^(\[rank \d+\] )?(?P<said>([\w.-]+: )?error\b.*:.*)$", re.IGNORECASE)
#: a frame of a Python traceback, and a file of no trainer's own: an installed package's, the standard
#: library's, or none ('<frozen runpy>', '<string>')
_TB_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
_LIBRARY = re.compile(r"[/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d[\d.]*[/\\]|^<")
#: the markers under a traceback's source line that point at the expression ('   ^^^^^^')
_CARETS = re.compile(r"^\s*[\^~]+\s*$")


def short_exception(text: str) -> str:
    """A rank's exception without gloo's source path: 'RuntimeError: Connection closed by peer [..]:1686'."""
    m = re.match(r"^(?P<name>[\w.]+): (\[[^\]]*\] )?(?P<msg>.*)$", text)
    if m is None:
        return text[:EXCERPT_CHARS]
    return f"{m['name'].split('.')[-1]}: {m['msg'].split('. ')[0][:EXCERPT_CHARS]}"


def has_traceback(text: str) -> bool:
    """Whether ``text`` holds a Python traceback of the trainer's own (torchrun's report that a
    worker failed is none): a trainer that ends on a one-line error of its own prints none."""
    return bool(_raised(_unprefixed(text)))


def _unprefixed(text: str) -> list[str]:
    """The lines of a log, each without its '[rankN]: ' prefix."""
    return [m.group(2) if (m := RANK_LINE.match(ln)) else ln for ln in text.splitlines()]


def raised_in(lines: list[str]) -> list[str]:
    """The exception line of each Python traceback in ``lines``, in order. Each exception line
    closes the earliest traceback still open: two processes that print a traceback at once
    interleave their lines, and each traceback still gets its own exception, not the other's
    'Traceback' header."""
    raised: list[str] = []
    still_open = 0
    for ln in lines:
        if ln.startswith(TRACEBACK):
            still_open += 1
        elif still_open and exception_line(ln):
            raised.append(ln.strip())
            still_open -= 1
    return [e for e in raised if e]


def exception_line(ln: str) -> bool:
    """Whether a line inside a traceback can be its exception's: not indented (frames and source
    lines are) and not only the markers under a source line, which two processes writing at once
    can leave at a line's start ('^^^^^^')."""
    return bool(ln) and not ln[0].isspace() and not _CARETS.match(ln)


def _raised(lines: list[str]) -> list[str]:
    """The exception line of each Python traceback in ``lines`` but torchrun's ChildFailedError, in order."""
    return [e for e in raised_in(lines) if _CHILD_FAILED not in e.split(":")[0]]


def last_exception(text: str) -> str | None:
    """The exception of the last Python traceback in ``text`` ('pkg.Error: message', a '[rankN]: '
    prefix dropped) other than torchrun's report that a worker failed (ChildFailedError), else the
    last line that looks like an error (``_ERROR_LINE``, ``_SAID_ERROR``); None when there is neither."""
    lines = _unprefixed(text)
    own = _raised(lines)
    if own:
        return own[-1]
    for ln in reversed(lines):
        if _ERROR_LINE.match(ln) and _CHILD_FAILED not in ln:
            return ln.strip()
        if said := _SAID_ERROR.match(ln):
            return said["said"].strip()
    return None


def traceback_of(lines: list[str], exception: str) -> dict:
    """Of a rank's own lines (its prefix dropped) that end its traceback in ``exception``: the
    traceback's text (from its first 'Traceback' line, which a chained exception's precede, to that
    exception; its last STDERR_TAIL_LINES lines), and the innermost frame of the last traceback in
    the trainer's own code with its source line, and the collective it was in (RankFailure)."""
    end = max(i for i, ln in enumerate(lines) if ln.strip() == exception) + 1
    starts = [i for i, ln in enumerate(lines[:end]) if ln.startswith(TRACEBACK)]
    if not starts:
        return {}
    out: dict = {"traceback": "\n".join(lines[starts[0]:end][-STDERR_TAIL_LINES:])}
    last = lines[starts[-1]:end]
    frames = [Frame(m["file"], int(m["line"]), m["func"].strip()) for ln in reversed(last) if (m := _TB_FRAME.match(ln))]
    if (collective := collective_of(frames)) is not None:
        out["collective"] = collective
    for i in reversed(range(len(last))):
        m = _TB_FRAME.match(last[i])
        if m is None or _LIBRARY.search(m["file"].replace("\\", "/")):
            continue
        out["raised_at"] = Frame(m["file"], int(m["line"]), m["func"].strip())
        code = last[i + 1] if i + 1 < len(last) else ""
        if code.startswith("    ") and not _TB_FRAME.match(code) and not _CARETS.match(code):
            out["raised_code"] = _without_comment(code.strip())
        break
    return out


def own_frame(frames: list[Frame]) -> Frame | None:
    """The innermost of ``frames`` (most recent first) in the trainer's own code: no installed package's, no
    standard library's (``_LIBRARY``); None where none is."""
    return next((f for f in frames if not _LIBRARY.search(f.file.replace("\\", "/"))), None)


def _without_comment(code: str) -> str:
    """A traceback's source line without its trailing comment: the finding quotes what ran (a
    comment's words, 'a hung rank stops the others here', would read as the harness's)."""
    cut = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(code).readline):
            if tok.type == tokenize.COMMENT:
                cut = tok.start[1]
                break
    except (tokenize.TokenError, SyntaxError):  # a line of a statement that goes on: its tokens so far
        pass
    return code if cut is None else code[:cut].rstrip()
