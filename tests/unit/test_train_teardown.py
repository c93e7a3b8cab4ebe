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
    (0, 2, "NCCL error: remote process exited or there was a network error", "rank 1"),
    (0, 2, "injected crash on rank 0 at step 2 stage forward", None),
    (0, 1, GLOO_RESET, None),
])
def test_lost_peer_names_the_peer_of_an_error_that_says_it_is_gone(rank, world, text, peer):
    info = DistInfo(rank, rank, world, "ddp" if world > 1 else "single", "gloo" if world > 1 else None,
                    torch.device("cpu"))
    assert lost_peer(info, RuntimeError(text)) == peer
