"""teardown(): a clean finish waits for every rank (bounded), an unclean one does not wait.
lost_peer(): which errors of a collective say that a peer is gone, and which peer."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from nsa.train.distributed import DistInfo, lost_peer, teardown

REPO = Path(__file__).resolve().parents[2]
RANK_SCRIPT = textwrap.dedent("""
    import sys, datetime, torch, torch.distributed as dist
    sys.path.insert(0, ".")
    from nsa.train.distributed import DistInfo, teardown
    rank, store = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    info = DistInfo(rank, rank, 2, "ddp", "gloo", torch.device("cpu"))
    if rank == 1:
        sys.exit(0)  # a peer that never reaches the exit barrier
    teardown(info, synchronize=True, timeout_s=3)
    print("torn down", dist.is_initialized())
""")


def _run_pair(tmp_path: Path) -> tuple[subprocess.CompletedProcess, float]:
    store = tmp_path / "store"
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(store)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for r in (0, 1)]
    out, err = procs[0].communicate(timeout=120)
    procs[1].communicate(timeout=120)
    return subprocess.CompletedProcess(procs[0].args, procs[0].returncode, out, err), time.monotonic() - t0


def test_clean_teardown_of_a_world_of_one_destroys_the_group():
    torch.distributed.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    info = DistInfo(0, 0, 1, "ddp", "gloo", torch.device("cpu"))
    teardown(info, synchronize=True, timeout_s=5)
    assert not torch.distributed.is_initialized()


def test_the_exit_barrier_is_bounded_when_a_peer_never_arrives(tmp_path: Path):
    proc, elapsed = _run_pair(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "torn down False" in proc.stdout
    assert "ranks did not meet before exit" in proc.stdout
    assert elapsed < 60, f"teardown waited {elapsed:.0f} s for a peer that had left"


GLOO_RESET = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:6051: "
              "Connection reset by peer. This is typically caused by a remote worker hanging or bugs in the application.")


@pytest.mark.parametrize("rank, world, text, peer", [
    (0, 2, GLOO_RESET, "rank 1"),
    (1, 2, "[../gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:1686", "rank 0"),
    (0, 2, "[../gloo/transport/tcp/pair.cc:410] writev [127.0.0.1]:1686: Broken pipe", "rank 1"),
    (0, 3, GLOO_RESET, "a peer rank (the backend's error does not say which)"),
    (1, 4, GLOO_RESET, "rank 2 (process gone)"),
    (0, 4, GLOO_RESET, "ranks 1, 3 (process gone)"),
    (0, 2, "NCCL error: remote process exited or there was a network error", "rank 1"),
    (0, 2, "injected crash on rank 0 at step 2 stage forward", None),
    (0, 1, GLOO_RESET, None),
])
def test_lost_peer_names_the_peer_of_an_error_that_says_it_is_gone(rank, world, text, peer):
    info = DistInfo(rank, rank, world, "ddp" if world > 1 else "single", "gloo" if world > 1 else None,
                    torch.device("cpu"))
    looked = []

    def gone() -> list[int]:
        looked.append(True)
        return {(1, 4): [2], (0, 4): [1, 3]}.get((rank, world), [])

    assert lost_peer(info, RuntimeError(text), gone) == peer
    # the processes are looked up only where they decide: an error that says a peer is gone, of several
    assert bool(looked) == (peer is not None and world > 2)


def test_ranks_gone_are_those_whose_heartbeats_name_a_process_of_this_host_that_ended(tmp_path: Path):
    """Rank 1's last record names a process that has exited; rank 2's this live one; rank 3's a
    process of another host; rank 4 wrote none; rank 5's last line was torn by the kill."""
    import json
    import os
    import socket

    from nsa.train.telemetry import ranks_gone

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    here, pid = socket.gethostname(), int(ended.stdout)

    def beats(rank: int, *records: dict) -> None:
        (tmp_path / f"heartbeat_rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    beats(1, {"pid": os.getpid(), "host": here, "step": 1}, {"pid": pid, "host": here, "step": 2})
    beats(2, {"pid": pid, "host": here, "step": 1}, {"pid": os.getpid(), "host": here, "step": 2})
    beats(3, {"pid": pid, "host": here + "-other", "step": 2})
    (tmp_path / "heartbeat_rank5.jsonl").write_text(json.dumps({"pid": pid, "host": here}) + '\n{"pid": ')
    assert ranks_gone(tmp_path, [1, 2, 3, 4, 5]) == [1]
    assert ranks_gone(tmp_path, [2, 3, 4], wait_s=0.1) == []
