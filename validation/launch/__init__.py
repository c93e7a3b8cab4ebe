"""Stage: launching and watching a trainer. Command lines from argument lists (commands.py,
foreign.py), one process tree (or one per node: several torchrun agents) run under a hard timeout
(process.py) whose every process is tracked and killed (tree.py), also when the harness dies
(warden.py; what a dead harness left running anyway is stopped by the next run, orphans.py), its
progress watched for stalls (watch.py) and its ranks' stacks taken before a stalled or timed-out run is killed (stacks.py);
how a train point's trainer starts (launcher.py): python, torchrun, one torchrun agent per node on
this host (nodes.py) or srun of torchrun in a Slurm allocation (slurm.py); the phase kinds
(kinds.py: train, pytest, preflight, profile)."""
