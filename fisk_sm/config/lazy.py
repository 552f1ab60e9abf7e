"""Lazy package exports (PEP 562), so that importing a package costs nothing.

A package lists `name -> module` and binds the two functions `exports` returns as its own
`__getattr__` and `__dir__`: a name's module is imported the first time the name is looked up,
never when the package is. Standard library only: every package's `__init__` imports it.
"""

from __future__ import annotations

import importlib
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

__all__ = ["exports"]


def exports(
    package: str, table: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose name `n` lives in module `table[n]`.

    A name is imported once: its value is then stored in the package, so that later lookups are
    plain attribute reads. A name that is no submodule's and not in `table` is an AttributeError.
    """

    def __getattr__(name: str) -> object:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(table))

    return __getattr__, __dir__
