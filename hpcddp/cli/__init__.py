"""The ``hpcddp`` command, on top of every other wing: parsing, printing, exit statuses.

Torch-free at import: ``hpcddp submit|status|logs|sbatch`` answer on a login node in a blink.
Subcommands that train import the rank side inside the function that needs it.
"""

from hpcddp.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
