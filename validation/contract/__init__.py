"""Stage: what a trainer leaves. Readers of the artifact contract's files (``nsa.contract`` is
the schema), the contract check, stack and torchrun-log parsers, and adapters that turn another
trainer's own files into the contract. Nothing here judges: validation/judge does."""
