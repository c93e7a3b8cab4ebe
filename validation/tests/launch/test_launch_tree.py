"""Process hygiene: a launched trainer's whole tree dies with the run, however its processes left
the tree (a session of their own, reparented to PID 1, an environment without the token), on the
timeout, on an interrupt and after a normal exit (validation/launch/tree.py, process.py)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import psutil
import pytest

from validation.launch import commands
from validation.launch import process as runner
from validation.launch.tree import RUN_TOKENS, ProcessTree, token_carriers, with_token


@pytest.fixture
def marker():
    """A unique word in the command line of every process a test starts; whatever still runs
    with it when the test ends is killed (and the test has failed already)."""
    word = f"hygiene-{uuid.uuid4().hex}"
    yield word
    for p in _running(word):
        p.kill()


def _running(word: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE
            and word in " ".join(p.info["cmdline"] or ())]


def _script(body: str, marker: str) -> list[str]:
    """A python -c program (the marker as its argument, so that it shows in the command line)."""
    return [sys.executable, "-c", textwrap.dedent(body), marker]


def _sleeper(marker: str) -> str:
    """Python source of a command that sleeps with the marker in its command line."""
    return repr([sys.executable, "-c", "import time; time.sleep(120)", marker])


def _wait_for(pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_timeout_kills_workers_reparented_in_sessions_of_their_own(tmp_path, marker):
    """torchrun's shape, and worse: the workers start sessions of their own and their parent
    exits, so they are reparented (to PID 1) while the root lives on. Killing the root's group
    or its descendants at the timeout leaves them running."""
    body = f"""
        import subprocess, sys, time
        mid = subprocess.Popen([sys.executable, "-c", '''
        import subprocess, time
        for _ in range(2):
            subprocess.Popen({_sleeper(marker)}, start_new_session=True)
        ''', sys.argv[1]])
        mid.wait()
        time.sleep(120)
        """
    res = runner.run(_script(body, marker), env=commands.child_env({}), cwd=tmp_path, timeout_s=3, log_dir=tmp_path)
    assert res.timed_out
    assert not _running(marker), "a worker of the timed-out run survived"


def test_a_worker_that_escaped_before_any_poll_is_found_by_its_token(tmp_path, marker):
    """The root starts a detached worker (own session, parent gone) and exits at once, before
    the first poll could see the worker: only the token in its environment finds it."""
    body = f"""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import subprocess; subprocess.Popen({_sleeper(marker)}, "
                          "start_new_session=True)", sys.argv[1]]).wait()
        """
    res = runner.run(_script(body, marker), env=commands.child_env({}), cwd=tmp_path, timeout_s=30, log_dir=tmp_path)
    assert res.exit_code == 0
    assert not _running(marker), "the detached worker outlived a run that exited 0"


def test_the_token_sweep_kills_without_any_poll(marker):
    tree = ProcessTree()
    env = tree.environment(os.environ)
    subprocess.Popen([sys.executable, "-c", f"import subprocess; subprocess.Popen({_sleeper(marker)}, "
                      "start_new_session=True)", marker], env=env).wait()
    _wait_for(lambda: len(_running(marker)) == 1)
    [escaped] = _running(marker)
    assert escaped.ppid() != os.getpid() and [p.pid for p in token_carriers(tree.token)] == [escaped.pid]
    assert tree.kill() == [escaped.pid]
    assert not _running(marker)


def test_the_sweep_outruns_a_process_that_keeps_forking(tmp_path, marker):
    """A process forking new sessions every few milliseconds: a child forked between a scan and
    the kill is found by the next scan; the sweep ends only when one finds none alive."""
    body = """
        import os, time
        while True:
            if os.fork() == 0:
                os.setsid()
                time.sleep(120)
                os._exit(0)
            time.sleep(0.005)
        """
    tree = ProcessTree()
    proc = subprocess.Popen(_script(body, marker), env=tree.environment(os.environ), start_new_session=True)
    tree.adopt(proc.pid)
    _wait_for(lambda: len(_running(marker)) > 20)
    tree.kill()
    proc.wait()
    assert not _running(marker)


def test_a_process_without_the_token_is_killed_when_a_poll_saw_it(tmp_path, marker):
    """A worker started with an environment of its own (no token) in its own session, whose
    parent then exits: the polls saw it while it was a descendant, so the timeout kills it."""
    body = f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", '''
        import subprocess, time
        subprocess.Popen({_sleeper(marker)}, start_new_session=True, env={{}})
        time.sleep(1.5)
        ''', sys.argv[1]], env={{}})
        time.sleep(120)
        """
    res = runner.run(_script(body, marker), env=commands.child_env({}), cwd=tmp_path, timeout_s=4, log_dir=tmp_path)
    assert res.timed_out
    assert not _running(marker)


def test_abort_kills_the_tree_and_raises_in_a_worker_thread(tmp_path, marker):
    """The CLI's stop signals set the session's abort flag; a point running under it in a worker
    thread kills its tree and raises KeyboardInterrupt there."""
    body = f"""
        import subprocess, time
        subprocess.Popen({_sleeper(marker)}, start_new_session=True)
        time.sleep(120)
        """
    raised, abort = [], threading.Event()

    def point():
        try:
            with runner.aborted_by(abort):
                runner.run(_script(body, marker), env=commands.child_env({}), cwd=tmp_path, timeout_s=60,
                           log_dir=tmp_path)
        except KeyboardInterrupt:
            raised.append(True)

    worker = threading.Thread(target=point)
    worker.start()
    try:
        _wait_for(lambda: len(_running(marker)) == 2)
    finally:
        abort.set()
        worker.join(20)
    assert raised and not worker.is_alive()
    assert not _running(marker)


def test_nothing_starts_once_aborted(tmp_path, marker):
    abort = threading.Event()
    abort.set()
    with runner.aborted_by(abort), pytest.raises(KeyboardInterrupt):
        runner.run(_script("import time; time.sleep(120)", marker), env=commands.child_env({}), cwd=tmp_path,
                   timeout_s=60, log_dir=tmp_path)
    assert not _running(marker) and not list(tmp_path.glob("*.log")), "a process was started"


def test_tokens_nest(monkeypatch):
    """A harness launched by a harness (a pytest phase running these tests) keeps the outer
    token beside its own, so that the outer sweep still finds the inner trainers."""
    assert with_token(with_token({"PATH": "/bin"}, "outer"), "inner") == {"PATH": "/bin", RUN_TOKENS: "outer,inner"}
    monkeypatch.setenv(RUN_TOKENS, "outer")
    tree = ProcessTree()
    assert tree.environment(commands.child_env({}))[RUN_TOKENS] == f"outer,{tree.token}"
