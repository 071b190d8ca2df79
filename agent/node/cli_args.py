"""Argument types shared by the command lines (``python -m agent``, ``python -m demo``); no Django.

Each raises ``argparse.ArgumentTypeError`` with the offending text, so argparse prints ``error: --flag: ...`` and
exits 2 instead of a traceback.
"""
from __future__ import annotations

import argparse
import math

from agent.contract.broker import BROKER_SCHEMES, broker_url  # re-exported: the command lines' --broker type

__all__ = ["BROKER_SCHEMES", "broker_url", "positive_float", "positive_int"]


def positive_int(text: str) -> int:
    """An integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (``nan`` and ``inf`` are refused: as intervals they stop a loop or spin it)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value
