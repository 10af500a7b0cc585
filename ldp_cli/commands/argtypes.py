"""argparse ``type=`` checks shared by the ``ldp`` sub-commands: each raises
:class:`argparse.ArgumentTypeError` with the bound it wants and the text it got."""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "probability", "positive", "seed"]


def positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def probability(text: str) -> float:
    """A probability in (0, 1] (a sampling rate: 0 would sample nothing)."""
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def seed(text: str) -> int:
    """A seed for numpy's SeedSequence-based generators: an integer in [0, 2**63)."""
    v = int(text)
    if not 0 <= v < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63), got {text}")
    return v
