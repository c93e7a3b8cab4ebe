"""Stage: keeping results. The result store (one record per point, written atomically), golden
loss curves and their only writer (bless), and comparison with a baseline store."""
