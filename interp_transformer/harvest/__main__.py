"""``python -m interp_transformer.harvest``, also as ``torchrun ... -m interp_transformer.harvest``."""

import sys

from interp_transformer.harvest.cli import main

if __name__ == "__main__":
    sys.exit(main())
