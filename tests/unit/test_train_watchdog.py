"""Watchdog pieces that run in-process: SIGUSR1 stack dumps, the .HALT record, fault specs.
(The full stall -> dump -> .HALT -> exit path is tests/integration/test_train_distributed.py.)"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nsa.config import ConfigError
from nsa.train.config import WatchdogConfig
from nsa.train.faults import Fault, parse_faults
from nsa.train.watchdog import Watchdog, read_halt, stackdump_path, write_halt


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")
def test_sigusr1_dumps_every_thread_without_stopping(tmp_path: Path):
    wd = Watchdog(WatchdogConfig(enabled=False), tmp_path, rank=3, world_size=4)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
        text = stackdump_path(tmp_path, 3).read_text()
        assert "most recent call first" in text and "test_sigusr1_dumps_every_thread" in text
    finally:
        wd.close()
    assert stackdump_path(tmp_path, 3).exists()  # not empty, so kept


def test_unused_empty_dump_files_are_removed(tmp_path: Path):
    wd = Watchdog(WatchdogConfig(timeout_s=60), tmp_path, rank=0, world_size=1)
    wd.start()
    wd.beat(1, "forward")
    wd.close()
    assert not stackdump_path(tmp_path, 0).exists()


def test_close_ends_the_thread_without_waiting_out_its_poll(tmp_path: Path):
    """A run's end does not wait for the watchdog thread's poll (a select on the signals' wakeup
    pipe where the main thread could take it, else an Event's wait)."""
    wd = Watchdog(WatchdogConfig(timeout_s=60, poll_s=30), tmp_path, rank=0, world_size=1)
    wd.start()
    wd.beat(1, "forward")
    time.sleep(0.1)  # the thread is in its wait
    t0 = time.monotonic()
    wd.close()
    assert time.monotonic() - t0 < 5
    assert not wd._thread.is_alive()


def _watching(tmp_path: Path, **cfg) -> tuple[Watchdog, list[str]]:
    """A started Watchdog whose firing is recorded (and stops it) instead of ending the process."""
    wd = Watchdog(WatchdogConfig(poll_s=0.05, **cfg), tmp_path, rank=0, world_size=1)
    fired: list[str] = []
    wd.fire = lambda reason: (fired.append(reason), wd._stop.set())
    wd.start()
    return wd, fired


def test_the_startup_limit_holds_until_the_first_steady_step(tmp_path: Path):
    wd, fired = _watching(tmp_path, timeout_s=0.3, startup_s=30)
    try:
        wd.beat(1, "forward")  # a first step compiling
        wd.steady_from(2)
        time.sleep(0.8)
        assert fired == [] and wd.limit() == (30, "watchdog.startup_s")
        wd.beat(2, "data")  # the first steady step: timeout_s from here on
        time.sleep(0.8)
        assert len(fired) == 1 and "(watchdog.timeout_s=0.3)" in fired[0]
    finally:
        wd.close()


def test_a_stall_in_set_up_fires_after_startup_s(tmp_path: Path):
    wd, fired = _watching(tmp_path, timeout_s=0.2, startup_s=0.8)
    try:
        wd.beat(0, "setup")
        time.sleep(0.5)
        assert fired == []
        time.sleep(1.0)
        assert len(fired) == 1 and "(watchdog.startup_s=0.8)" in fired[0]
    finally:
        wd.close()


def test_startup_s_never_shortens_timeout_s(tmp_path: Path):
    wd = Watchdog(WatchdogConfig(timeout_s=60, startup_s=5), tmp_path, rank=0, world_size=1)
    try:
        assert wd.limit() == (60, "watchdog.timeout_s")
    finally:
        wd.close()
    with pytest.raises(ValueError, match="watchdog.startup_s"):
        WatchdogConfig(startup_s=0)


def test_a_stall_fires_within_a_poll_of_timeout_s(tmp_path: Path):
    """The main thread stuck, the watchdog thread running: it fires once timeout_s has passed,
    within a poll or so, not later for the check of its own wait (a suspended process)."""
    wd, fired = _watching(tmp_path, timeout_s=1.0, startup_s=1.0)
    fired_at: list[float] = []
    wd.fire = lambda reason: (fired.append(reason), fired_at.append(time.monotonic()), wd._stop.set())
    try:
        last_beat = time.monotonic()  # before the beat: the watchdog's clock starts no earlier than this
        wd.beat(1, "forward")
        time.sleep(2.2)
        # a poll late under load is fine; a clock restarted by the stall itself would fire at 2.0 or later
        assert len(fired) == 1 and 1.0 <= fired_at[0] - last_beat < 1.9, (fired, fired_at[0] - last_beat)
    finally:
        wd.close()


# A process that beats, then works 1 s between beats (under the 1.5 s limit); each beat marks a
# file, so the test can suspend it at the start of such a second.
_BEATING = """
import sys, time
from pathlib import Path
from nsa.train.config import WatchdogConfig
from nsa.train.watchdog import Watchdog
out = Path(sys.argv[1])
wd = Watchdog(WatchdogConfig(timeout_s=1.5, startup_s=1.5, poll_s=0.1, grace_s=0.5), out, 0, 1)
wd.start()
for step in range(1, 7):
    wd.beat(step, "forward")
    (out / f"beat{step}").touch()
    for _ in range(20):
        time.sleep(0.05)
wd.close()
print("done")
"""


def _started(script: str, tmp_path: Path, marker: str) -> subprocess.Popen:
    """``python -c script tmp_path``, once it has written tmp_path/marker (within 60 s)."""
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / marker).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{marker} not written: {proc.communicate()}")
        time.sleep(0.01)
    return proc


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="no SIGSTOP on this platform")
def test_a_process_suspended_longer_than_timeout_s_is_not_a_stall_on_resuming(tmp_path: Path):
    """Ctrl-Z (SIGSTOP) for longer than watchdog.timeout_s, then SIGCONT: the watchdog thread,
    stopped too, counted the whole suspension as time without progress and killed the run as a
    stall the moment it resumed. (Shorter than the C backstop's timeout_s + grace_s + 10 s.)"""
    _beats_through_a_suspension(tmp_path, signal.SIGSTOP, 4.0)
    assert read_halt(tmp_path) is None


def _beats_through_a_suspension(tmp_path: Path, sig: signal.Signals, seconds: float) -> None:
    """_BEATING stopped by ``sig`` for ``seconds`` once it has beaten twice, then continued: it must
    finish its beats and exit 0."""
    proc = _started(_BEATING, tmp_path, "beat2")
    try:
        proc.send_signal(sig)
        _stopped(proc)
        time.sleep(seconds)
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0 and out.strip() == "done", (proc.returncode, err[-2000:])


def _stopped(proc, within_s: float = 30.0) -> None:
    """Wait until ``proc`` is stopped (a signal lands asynchronously); fail if it never is."""
    import psutil

    deadline = time.monotonic() + within_s
    while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
        assert proc.poll() is None and time.monotonic() < deadline, (proc.poll(), psutil.Process(proc.pid).status())
        time.sleep(0.01)


@pytest.mark.skipif(not hasattr(signal, "SIGTSTP"), reason="no job control on this platform")
def test_ctrl_z_longer_than_the_backstop_does_not_end_the_run(tmp_path: Path):
    """Ctrl-Z (SIGTSTP) for longer than the C backstop's timeout_s + grace_s + 10 s (12 s here):
    faulthandler's timer thread, its deadline passed, ended the process the moment it resumed (exit
    1, a 'Timeout' dump), before any Python code could run. The watchdog now takes Ctrl-Z: it
    disarms the backstop, stops the process, and arms it afresh once resumed."""
    _beats_through_a_suspension(tmp_path, signal.SIGTSTP, 13.0)
    assert read_halt(tmp_path) is None and not stackdump_path(tmp_path, 0).exists()


# Beats until the test says go, then hangs holding the GIL (a C call through PyDLL): only the C
# backstop can end it (the watchdog thread cannot run), timeout_s + grace_s + 10 s after the last beat.
_HANGING = """
import ctypes, sys, time
from pathlib import Path
from nsa.train.config import WatchdogConfig
from nsa.train.watchdog import Watchdog
out = Path(sys.argv[1])
wd = Watchdog(WatchdogConfig(timeout_s=1.0, startup_s=1.0, poll_s=0.1, grace_s=0.5), out, 0, 1)
wd.start()
(out / "ready").touch()
while not (out / "go").exists():
    wd.beat(1, "forward")
    time.sleep(0.05)
ctypes.PyDLL(None).sleep(120)
print("not ended")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGTSTP"), reason="no job control on this platform")
def test_the_backstop_still_ends_a_hang_holding_the_gil_after_a_ctrl_z(tmp_path: Path):
    """Taking Ctrl-Z must not weaken the backstop: once resumed it is armed again, and a hang that
    keeps the watchdog thread from running ends with the backstop's dump and exit 1."""
    proc = _started(_HANGING, tmp_path, "ready")
    try:
        proc.send_signal(signal.SIGTSTP)
        _stopped(proc)
        proc.send_signal(signal.SIGCONT)
        (tmp_path / "go").touch()
        hung_at = time.monotonic()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 1 and "not ended" not in out, (proc.returncode, out, err[-2000:])
    assert time.monotonic() - hung_at < 11.5 + 10, "the backstop came late"
    assert "Timeout (0:00:11.500000)!" in stackdump_path(tmp_path, 0).read_text()


def test_halt_records(tmp_path: Path):
    assert read_halt(tmp_path) is None
    (tmp_path / ".HALT").touch()
    assert read_halt(tmp_path)["source"] == "operator"
    assert write_halt(tmp_path, {"source": "watchdog"}) is False  # never overwrites
    (tmp_path / ".HALT").unlink()
    assert write_halt(tmp_path, {"source": "watchdog", "rank": 1}) is True
    assert json.loads((tmp_path / ".HALT").read_text())["rank"] == 1 and read_halt(tmp_path)["source"] == "watchdog"


def test_fault_specs_parse():
    assert parse_faults("stall:rank=1:step=3") == [Fault("stall", rank=1, step=3)]
    assert parse_faults("crash:step=2:stage=backward,kill:rank=0:step=5") == [
        Fault("crash", step=2, stage="backward"), Fault("kill", rank=0, step=5)]
    assert parse_faults("nan:stage=data")[0].stage == "forward"  # nan acts on the loss
    assert parse_faults("stall:seconds=1.5")[0].seconds == 1.5
    assert Fault("stall", rank=1, step=3).applies(1, 3, "forward")
    assert not Fault("stall", rank=1, step=3).applies(0, 3, "forward")


@pytest.mark.parametrize("spec, msg", [
    ("boom", "unknown fault"), ("stall:rank", "expected key=value"), ("stall:step=x", "not a number"),
    ("stall:stage=lunch", "stage must be one of"), ("stall:when=3", "unknown key"),
])
def test_bad_fault_specs_name_the_problem(spec, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_faults(spec)


def test_halt_is_never_seen_half_written(tmp_path, monkeypatch):
    """A writer stopped mid-record (killed, or the record fails to serialize) leaves no .HALT, or
    another rank's watchdog would read the half record as an operator's stop."""
    def torn(record, **options):
        raise KeyboardInterrupt  # stopped before the record was complete
    monkeypatch.setattr("nsa.train.watchdog.strict_json.dumps", torn)
    with pytest.raises(KeyboardInterrupt):
        write_halt(tmp_path, {"source": "watchdog", "rank": 0})
    assert read_halt(tmp_path) is None and list(tmp_path.iterdir()) == []


# Set-up that takes a while (a corpus read, a compile, a checkpoint load): the loop has not started.
_SETTING_UP = """
import sys, time
from pathlib import Path
from nsa.train.config import WatchdogConfig
from nsa.train.watchdog import Watchdog
out = Path(sys.argv[1])
wd = Watchdog(WatchdogConfig(timeout_s=60, startup_s=60, poll_s=0.1, term_grace_s=30), out, 0, 1)
wd.start()
wd.beat(0, "setup")
(out / "ready").touch()
time.sleep(60)
print("not ended")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name == "nt", reason="no POSIX signals here")
def test_a_sigterm_during_set_up_ends_the_process_at_once(tmp_path: Path):
    """`kill -TERM` of `python -m nsa.train` while it set up (before step 1) printed 'stopping after
    this step and saving a checkpoint' and held the process for watchdog.term_grace_s (20 s) before
    it ended by SIGTERM: there was no step to finish and nothing to save. It now ends at once,
    leaving no empty stack dump and no complaint about an env.json not yet written."""
    proc = _started(_SETTING_UP, tmp_path, "ready")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err)
    assert time.monotonic() - t0 < 10, err
    assert "SIGTERM during set-up, before the first step: nothing to save; ending by SIGTERM now" in err, err
    assert "saving a checkpoint" not in err and "not ended" not in out
    assert "could not record the status" not in err and not stackdump_path(tmp_path, 0).exists(), err
