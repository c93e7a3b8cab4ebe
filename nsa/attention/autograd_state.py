"""What the caller's autograd state lets an attention layer do beside computing its output: keep
tensors through saved-tensor hooks of its own (the recomputation at long context), replay CUDA
graphs (nsa.attention.graphed), add to its call count. A caller's own saved-tensor hooks and the
torch.func transforms each rule some of these out."""
from __future__ import annotations

import contextlib

import torch


def saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are active (activation checkpointing, offloading): they expect
    a recomputation to save what the first forward saved, which a replay does not."""
    return torch._C._autograd._top_saved_tensors_default_hooks(False) is not None


def func_transform_active() -> bool:
    """Whether a torch.func transform (grad, vjp, jvp, vmap) is running, whichever tensors it
    wraps (torch.func.functional_call differentiates the parameters, not the input). It takes no
    saved-tensor hooks and no CUDA graph capture, and it forbids mutating a tensor it captured."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def unwrapped():
    """A context in which tensors are made plain even under a torch.func transform, which wraps
    what it sees made for its own level (a factory's output too): one kept past the transform (a
    cache) breaks the next transform's call that reads it."""
    return torch._C._DisableFuncTorch() if func_transform_active() else contextlib.nullcontext()


def count_call(calls: torch.Tensor) -> None:
    """calls += 1 (a layer's forward count for the backend audit), also under a torch.func
    transform, where the buffer is a captured tensor: the count then bypasses the transform."""
    if torch.compiler.is_compiling():
        calls += 1
    else:
        with unwrapped():
            calls += 1
