"""``python -m validation`` is the ``nsa-validate`` CLI."""
from validation.cli import main

raise SystemExit(main())
