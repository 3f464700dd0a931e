"""``python -m interp_transformer``: the installed ``interp-transformer`` command line.

The command line lives in the ``analysis`` package (``demo`` and ``report`` run the
analysis tools), which the model package never imports; this runs the console script
the installed distribution declares.
"""

import sys
from importlib.metadata import entry_points


def main() -> int:
    scripts = entry_points(group="console_scripts", name="interp-transformer")
    if not scripts:
        print(
            "interp-transformer is not installed as a distribution: run `pip install -e .`, or `python -m analysis`",
            file=sys.stderr,
        )
        return 2
    return next(iter(scripts)).load()()


if __name__ == "__main__":
    sys.exit(main())
