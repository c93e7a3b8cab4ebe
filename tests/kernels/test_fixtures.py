"""The kernel tests' own fixtures (conftest.py) leave PyTorch working as a user's code expects,
in the test and in every test after it in the same process."""
from __future__ import annotations

import torch


def test_a_device_context_builds_on_its_device_while_torch_empty_is_poisoned():
    """``with torch.device(...)`` redirects the factory functions it caches on its first use
    (torch.utils._device._device_constructors). Asked first while _nan_poisoned_empty had replaced
    torch.empty (a trace in test_compile.py asks), it cached the replacement: from then on, in that
    process, ``with torch.device("meta")`` built modules on the CPU, and the meta-device tests of
    tests/unit/test_attention_inputs.py failed after the compile tests on the same xdist worker."""
    with torch.device("meta"):
        assert torch.nn.Linear(2, 2).weight.device.type == "meta"
