"""argparse help formatters that find the terminal's width without importing shutil.

argparse's `HelpFormatter` asks `shutil.get_terminal_size()` for the width, and shutil imports
zlib, bz2, lzma and fnmatch: some 2.5 ms of `fisk-sm --help` and `fisk-sm ctl --help`, a quarter
of a bare interpreter's start. `terminal_columns` gives the same answer from `os` alone, so the
help wraps exactly as before.
"""

from __future__ import annotations

import argparse
import os
import sys

#: `typing.TYPE_CHECKING` without importing typing (type checkers read the name as True).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["HelpFormatter", "RawDescriptionHelpFormatter", "terminal_columns"]


def terminal_columns() -> int:
    """The width `shutil.get_terminal_size().columns` gives: $COLUMNS when it is a positive
    integer, else the width of the terminal on stdout, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, closed, or not a terminal
            columns = 0
    return columns or 80


def _with_width(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` with argparse's default width (the terminal's, less 2) when none is given."""
    if len(args) < 4 and kwargs.get("width") is None:  # (prog, indent, max_help_position, width)
        kwargs["width"] = terminal_columns() - 2
    return kwargs


class HelpFormatter(argparse.HelpFormatter):
    """`argparse.HelpFormatter`, sized by `terminal_columns`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_with_width(args, kwargs))


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`argparse.RawDescriptionHelpFormatter`, sized by `terminal_columns`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **_with_width(args, kwargs))
