"""Many independent Bernoulli(q) bits at once, packed 64 to a word.

Encoders that flip every bit of a long vector (CMS flips each of m sketch
coordinates) need n·m biased bits. Drawing one float per bit is slow, so
:func:`bernoulli_words` compares 64 uniform variables with q at a time,
bit-sliced: the t-th random word supplies the t-th binary digit of 64
independent uniforms U, and a lane is decided at the first digit where U
and q differ (U < q exactly when that digit of U is 0 and of q is 1). Lanes
still undecided after all digits of q have ``U >= q`` and give 0.

Every digit of the float ``q`` is used, so each output bit is 1 with
probability *exactly* ``q`` (the dyadic rational the float holds). The
expected number of random words per output word is about 7 (a lane stays
undecided after t digits with probability 2^-t), against 64 floats for the
naive way. The first few digits run on whole cache-sized chunks; the words
that remain undecided are then compacted and finished together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["bernoulli_words", "probability_digits"]

_ALL_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)
_CHUNK = 1 << 14
_FULL_STEPS = 10


_RAW64 = (np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox)


def _word_source(rng: np.random.Generator) -> Callable[[int], np.ndarray]:
    if isinstance(rng.bit_generator, _RAW64):
        return rng.bit_generator.random_raw
    return lambda size: rng.integers(0, _ALL_ONES, size=size, dtype=np.uint64, endpoint=True)


def probability_digits(q: float) -> list[int]:
    """The binary digits ``b_1 b_2 ...`` of ``q = 0.b_1 b_2 ...`` (q in [0, 1), exact)."""
    if not 0.0 <= q < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {q}")
    num, den = float(q).as_integer_ratio()
    t = den.bit_length() - 1
    return [(num >> (t - i)) & 1 for i in range(1, t + 1)]


def bernoulli_words(q: float, n_words: int, rng: np.random.Generator) -> np.ndarray:
    """``n_words`` ``uint64`` words whose bits are independent Bernoulli(``q``).

    Raw words come from ``rng.bit_generator.random_raw`` when the bit
    generator is known to emit 64 random bits per call (PCG64, PCG64DXSM,
    SFC64, Philox), else from ``rng.integers`` over all of ``uint64``."""
    digits = probability_digits(q)
    out = np.zeros(n_words, dtype=np.uint64)
    if n_words == 0 or not digits:
        return out
    draw = _word_source(rng)
    undecided = np.empty(n_words, dtype=np.uint64)
    spare = np.empty(min(_CHUNK, n_words), dtype=np.uint64)
    first = min(_FULL_STEPS, len(digits))
    for start in range(0, n_words, _CHUNK):
        stop = min(n_words, start + _CHUNK)
        res, home = out[start:stop], undecided[start:stop]
        und, nxt = home, spare[: stop - start]
        und[:] = _ALL_ONES
        for digit in digits[:first]:
            u = draw(stop - start)
            if digit:
                np.bitwise_and(und, u, out=nxt)  # still undecided: U's digit is 1 too
                np.bitwise_xor(und, nxt, out=und)  # decided now, with U < q
                res |= und
                und, nxt = nxt, und
            else:
                np.invert(u, out=u)
                und &= u
        if und is not home:
            home[:] = und
    idx = np.flatnonzero(undecided)
    if idx.size == 0 or first == len(digits):
        return out
    und, res = undecided[idx], out[idx]
    for digit in digits[first:]:
        u = draw(idx.size)
        if digit:
            still = und & u
            res |= und ^ still
            und = still
        else:
            und &= ~u
        keep = und != 0
        if not keep.all():
            out[idx] = res
            idx, und, res = idx[keep], und[keep], res[keep]
            if idx.size == 0:
                break
    if idx.size:
        out[idx] = res
    return out
