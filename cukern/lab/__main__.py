"""``python -m cukern.lab``: the command line (:mod:`cukern.lab.cli`), as the ``cukern`` script runs it."""

import sys

from cukern.lab.cli import main

sys.exit(main())
