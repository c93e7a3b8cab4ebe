"""``python -m nsa.train --config tiny --steps 10`` (see ``--help``)."""
import sys

from ..contract import CHECK_CONFIG_FLAG, LIST_KEYS_FLAG

if __name__ == "__main__":
    if LIST_KEYS_FLAG in sys.argv[1:]:
        # before the trainer is imported: the answer needs no torch (nsa/train/keys.py)
        from .keys import main as list_keys

        sys.exit(list_keys())
    if CHECK_CONFIG_FLAG in sys.argv[1:]:
        from .keys import check_main

        sys.exit(check_main())
    from .cli import main

    sys.exit(main())
