"""``python -m hpcddp`` is the ``hpcddp`` command."""

import sys

from hpcddp.cli import main

sys.exit(main())
