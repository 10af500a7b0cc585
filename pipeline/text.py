"""Device-supplied strings as a terminal, a log or a plot may show them: nothing that moves the cursor,
rings, reorders text or hides itself.

A heavy hitter's discovered value (and a dictionary label) is whatever devices sent: it can hold a
carriage return that overwrites the line, an escape sequence a terminal runs, a right-to-left override
that reverses what follows, or a zero-width character that makes two values look alike.
:func:`printable` writes every such character as a visible escape, ``\\xNN``, ``\\uNNNN`` or
``\\UNNNNNNNN`` (Unicode categories Cc, Cf, Cs, Co, Cn, Zl, Zp), and a backslash as ``\\\\`` so that the
escaped form reads back unambiguously. Letters, digits, punctuation, spaces and emoji stay as they are.
JSON output keeps the raw value (JSON escapes control characters itself); CSV keeps it too, quoted and
formula-safe (:mod:`pipeline.csv_export`).
"""

from __future__ import annotations

import unicodedata

__all__ = ["printable"]

_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def printable(value: object) -> str:
    """``value`` (a string, or anything ``str`` turns into one) with every invisible or text-moving character
    escaped (module docstring)."""
    text = value if isinstance(value, str) else str(value)
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif unicodedata.category(ch) in _HIDDEN:
            cp = ord(ch)
            out.append(f"\\x{cp:02x}" if cp < 0x100 else f"\\u{cp:04x}" if cp < 0x10000 else f"\\U{cp:08x}")
        else:
            out.append(ch)
    return "".join(out)
