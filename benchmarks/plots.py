"""A benchmark's plot, drawn where matplotlib is installed (the bench extra) and said so where not:
the tables and results files are the measurement, the plot only shows it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

NO_MATPLOTLIB = "no plot: matplotlib is missing (make .venv/.bench-done installs the bench extra)"


def draw(plot: Callable[[Path], None], path: Path) -> str:
    """Draw with `plot` into `path`, and say where it is, or why there is none."""
    try:
        plot(path)
    except ModuleNotFoundError as missing:
        if missing.name != "matplotlib":
            raise
        return NO_MATPLOTLIB
    return f"plot: {path}"
