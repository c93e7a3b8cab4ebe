"""Native Sparse Attention: attention module, oracle, kernels, model and trainer."""
