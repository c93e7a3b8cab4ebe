"""Stage: judging a run from what it left. Metrics (numbers from the contract's files), gates
(metric, comparison, threshold), a point's verdict and record, and findings across points."""
