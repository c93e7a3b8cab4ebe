"""Fast NSA backends (Triton kernels and library attention), registered with
nsa.attention.backends on import when their dependencies are present."""
