"""``python -m interp_transformer``: the same command line as ``interp-transformer``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
