"""A one-line progress bar on stderr for long runs (bench, tune, ladder), drawn only when stderr is a
terminal (and not ``quiet``), so logs and pipes stay clean. No dependencies."""

from __future__ import annotations

import sys
import time

WIDTH = 28


class Progress:
    """``Progress(total, label)``; ``step(note)`` after each unit of work (``n=0`` only shows what is running);
    ``clear()`` before printing a line; ``close()`` (or use as a context manager) erases the bar. Silent
    unless ``stream.isatty()``."""

    def __init__(self, total: int, label: str = "", stream=None, *, quiet: bool = False):
        self.total = max(int(total), 1)
        self.label = label
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.active = not quiet and bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.perf_counter()
        self._width = 0

    def step(self, note: str = "", n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        if self.active:
            self._draw(note)

    def line(self, note: str) -> str:
        filled = WIDTH * self.done // self.total
        bar = "#" * filled + "." * (WIDTH - filled)
        elapsed = time.perf_counter() - self.start
        return f"{self.label} [{bar}] {self.done}/{self.total} {elapsed:5.0f} s {note}"[:120]

    def _draw(self, note: str) -> None:
        text = self.line(note)
        self.stream.write("\r" + text.ljust(self._width))
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Erase the bar (before printing a line); the next ``step`` draws it again."""
        if self.active and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def close(self) -> None:
        self.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
