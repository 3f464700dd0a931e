"""``python -m interp_transformer.training CONFIG``, also as ``torchrun ... -m interp_transformer.training CONFIG``."""

import sys

from interp_transformer.training.cli import main

if __name__ == "__main__":
    sys.exit(main())
