"""The lab wing: what measures, tunes and explains the ops, standing above them (the ops never import it).

Generic modules: :mod:`.bench` (the benchmark), :mod:`.tune` (the tuner), :mod:`.card` and :mod:`.device`
(``explain``'s six-question card), :mod:`.report` (plots), :mod:`.pipeline` (host cost, CUDA graphs) and
:mod:`.progress`. Each kernel family has one module here that registers its benchmark cases, tunables,
cards and decode-step calls with them when imported; the line below imports every family.
"""

from . import rmsnorm, rotary, reduce, ladder  # not sorted: this is the order the benchmark runs
from . import qknorm, rmsnorm_backward
from . import argreduce, segment, scan
from . import layernorm
