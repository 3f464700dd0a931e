"""``python -m interp_transformer.harvest``, also as ``torchrun ... -m interp_transformer.harvest``."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
