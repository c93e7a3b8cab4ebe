"""Python imports this at start-up when its folder is on PYTHONPATH (tests/faults/test_rank_faults.py):
faults the trainer's own fault spec cannot inject, because they sit in the libraries under it.

NSA_TEST_BLOCKING_TEARDOWN=1: torch.distributed.destroy_process_group blocks, as it can over NCCL: there
destroying the communicator waits for peers that may themselves wait in a collective for this rank
(tests/faults/test_nccl_faults.py on two GPUs). Gloo on the CPU does not, so the fault suite stands it in this
way.

NSA_TEST_SLOW_HALT=1: rank 0 takes 2 s to write a non-finite loss's .HALT (a slow or loaded file
system), so that a rank that leaves without waiting for it has torchrun SIGTERM rank 0 before the
.HALT exists."""
import os

if os.environ.get("NSA_TEST_BLOCKING_TEARDOWN") == "1":
    import time

    import torch.distributed

    def _blocks(*args, **kwargs):
        time.sleep(3600)

    torch.distributed.destroy_process_group = _blocks

if os.environ.get("NSA_TEST_SLOW_HALT") == "1" and os.environ.get("RANK") == "0":
    import time

    from nsa.train import watchdog  # before nsa.train.loop imports write_halt from it

    _write_halt = watchdog.write_halt

    def _slow_halt(out_dir, record):
        if record.get("source") == "nonfinite":
            time.sleep(2.0)
        return _write_halt(out_dir, record)

    watchdog.write_halt = _slow_halt
