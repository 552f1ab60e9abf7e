"""Tools for the calculator example; loaded by agent.yaml as `calc_tools:add` and so on."""

from __future__ import annotations

from fisk_sm import tool


@tool
def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b
