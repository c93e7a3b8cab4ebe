"""Stage: launching and watching a trainer. Command lines from argument lists (python,
torchrun), one process tree run under a hard timeout and watched for progress, the phase
kinds (train, pytest, preflight, profile)."""
