"""Python imports this at start-up when its folder is on PYTHONPATH (tests/faults/test_rank_faults.py).
With NSA_TEST_BLOCKING_TEARDOWN=1, torch.distributed.destroy_process_group blocks, as it can over NCCL:
there destroying the communicator waits for peers that may themselves wait in a collective for this
rank (two H200s, docs/performance.md, twentieth set). Gloo on the CPU does not, so the fault suite
stands it in this way."""
import os

if os.environ.get("NSA_TEST_BLOCKING_TEARDOWN") == "1":
    import time

    import torch.distributed

    def _blocks(*args, **kwargs):
        time.sleep(3600)

    torch.distributed.destroy_process_group = _blocks
