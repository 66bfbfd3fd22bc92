"""``python -m cukern``: the command line lives in the lab wing, which the package never imports; this says where."""

import sys

sys.exit("cukern's command line is `python -m cukern.lab` (or the `cukern` script), e.g. python -m cukern.lab --help")
