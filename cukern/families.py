"""Every kernel family cukern builds: the op modules with a ``SOURCE`` file and an ``instantiations()``
table. The compile CLI and the compile tests walk this list, so a new family is covered by adding it here."""

from __future__ import annotations

import cukern._convert as convert
import cukern.argreduce as argreduce
import cukern.ladder as ladder
import cukern.layernorm as layernorm
import cukern.qknorm as qknorm
import cukern.reduce as reduce
import cukern.rmsnorm as rmsnorm
import cukern.rmsnorm_backward as rmsnorm_backward
import cukern.rotary as rotary
import cukern.scan as scan
import cukern.segment as segment


def all_families():
    return [rmsnorm, rmsnorm_backward, rotary, reduce, ladder, argreduce, qknorm, segment, scan, convert, layernorm]


def named(source: str):
    """The family whose kernels are ``cuda_src/<source>.cu``."""
    for family in all_families():
        if family.SOURCE == source:
            return family
    known = ", ".join(f.SOURCE for f in all_families())
    raise ValueError(f"no kernel family has source {source!r}; the families are {known}")
