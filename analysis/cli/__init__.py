"""The ``interp-transformer`` command line, one module per group of commands.

=====================  ==================================================================
``cli.main``           the parser, ``demo``, ``report``, ``verify`` and ``main(argv)``
``cli.common``         loading a model, reading a prompt, exit codes, ``UserError``
``cli.discovery``      ``patch``, ``circuit``
``cli.graphs``         ``train-transcoders``, ``graph``
``cli.lens``           ``lens train``, ``lens eval``
``cli.steer``          ``steer``
``cli.probe``          ``probe``
``cli.training``       ``train``, ``train-induction``, ``train-translation``, ``train-sae``
``cli.benchmark``      ``circuit-benchmark``
=====================  ==================================================================
"""

from .common import EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, UserError
from .main import DEFAULT_REPORT, build_parser, main

__all__ = ["DEFAULT_REPORT", "EXIT_MISMATCH", "EXIT_OK", "EXIT_USAGE", "UserError", "build_parser", "main"]
