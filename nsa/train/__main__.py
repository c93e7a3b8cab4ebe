"""``python -m nsa.train --config tiny --steps 10`` (see ``--help``)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
