"""The JSON Canonicalization Scheme (RFC 8785) for the values specs contain.

A spec's id is a hash of its canonical form, and other SDKs (Kotlin, Swift,
JavaScript) must reproduce that form byte for byte, so it follows a published
standard rather than one library's ``json.dumps`` defaults:

* UTF-8, no whitespace, separators ``,`` and ``:``;
* object keys sorted by their UTF-16 code units (RFC 8785 Sec. 3.2.3);
* strings with the minimal escapes: ``\\"``, ``\\\\``, ``\\b \\f \\n \\r \\t``,
  other controls below U+0020 as ``\\u00xx`` (lowercase hex); everything else
  literal (Sec. 3.2.2.2);
* numbers in ECMAScript's Number-to-String form (Sec. 3.2.2.3): the shortest
  digits that round-trip, integers without ``.0``, exponent form only below
  1e-6 or from 1e21 (``1e-7``, ``1e+21``). Integers must be exact doubles
  (``|i| <= 2**53``); NaN and the infinities are refused.

``JSON.stringify`` of an object whose keys were sorted produces the same
bytes, which is how ``tests/test_spec_ids.py`` checks this module.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["canonical_json", "canonical_number", "CanonicalizationError"]

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class CanonicalizationError(ValueError):
    """A value with no canonical JSON form (NaN, an infinity, an inexact integer, a lone surrogate...)."""


def canonical_number(x: float | int) -> str:
    """``x`` as ECMAScript's Number::toString writes it (ECMA-262, Number::toString, radix 10)."""
    if isinstance(x, bool):
        raise CanonicalizationError("a bool is not a number")
    if isinstance(x, int):
        if abs(x) > 2**53:
            raise CanonicalizationError(f"integer {x} is not exactly representable as an IEEE double")
        x = float(x)
    x = float(x)
    if not math.isfinite(x):
        raise CanonicalizationError(f"{x!r} has no JSON form")
    if x == 0.0:
        return "0"  # also -0
    if x < 0:
        return "-" + canonical_number(-x)
    # repr() gives the shortest round-trip digits (Python >= 3.1, like ECMAScript's
    # "k as small as possible"); take them apart into digits s and exponent n,
    # value = 0.s * 10**n.
    mantissa, _, exp = repr(x).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    n = len(whole) + (int(exp) if exp else 0) - (len(whole + frac) - len((whole + frac).lstrip("0")))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    sign = "+" if e >= 0 else "-"
    head = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{head}e{sign}{abs(e)}"


def _string(s: str) -> str:
    out = []
    for ch in s:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        elif "\ud800" <= ch <= "\udfff":
            raise CanonicalizationError(f"string {s!r} holds a lone surrogate")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _write(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, (int, float)):
        out.append(canonical_number(value))
    elif hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalar
        _write(value.item(), out)
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise CanonicalizationError(f"object key {key!r} is not a string")
        out.append("{")
        for i, key in enumerate(sorted(value, key=lambda k: k.encode("utf-16-be", "surrogatepass"))):
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    else:
        raise CanonicalizationError(f"{type(value).__name__} {value!r} has no canonical JSON form")


def canonical_json(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of ``value`` (dicts, lists, str, int, float, bool, None)."""
    out: list[str] = []
    _write(value, out)
    return "".join(out).encode("utf-8")
