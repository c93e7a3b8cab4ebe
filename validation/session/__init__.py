"""The acceptance session: one object that selects points, checks the store and goldens, runs
each point (launch, read, judge, store), stops on a signal and renders the report; the CLI and
the pytest plugin are two doors into it."""
