"""Stage: loading a runbook. YAML runbooks and hardware profiles read strictly into frozen
dataclasses, a runbook's own trainer (``trainer:``), and the expansion into phase points."""
