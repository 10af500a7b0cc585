"""Random generators for the device: a CSPRNG by default, seeds only in simulation.

Encoders take a :class:`numpy.random.Generator`. numpy's own bit generators
(PCG64, Philox, ...) are fast but not cryptographically secure: an observer
of enough outputs could predict later draws and undo the randomization. On a
device the SDK therefore uses :class:`UrandomBitGenerator`, a numpy bit
generator whose every 64-bit word comes from ``os.urandom`` (the operating
system's CSPRNG: ``getrandom(2)`` on Linux), plugged into
:class:`numpy.random.Generator` through numpy's documented C interface
(a ``bitgen_t`` struct in a capsule named ``"BitGenerator"``; see numpy's
"Extending via ctypes/CFFI" guide). It needs only the standard library
(``ctypes``). Draws cost about a microsecond more than PCG64; the SDK draws
on its background thread, never on the app's.

A seeded generator is available only through :func:`simulation_generator`,
which the client calls only in an explicit simulation/test mode (compare
Opacus' ``secure_mode``, which refuses seeds).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
import weakref

import numpy as np

__all__ = ["UrandomBitGenerator", "secure_generator", "simulation_generator"]

_WORDS = 512
_UNPACK = struct.Struct(f"<{_WORDS}Q").unpack
_DOUBLE_SCALE = 1.0 / 9007199254740992.0  # 2**-53

_U64_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p)
_U32_FN = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p)
_DBL_FN = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_void_p)


class _BitgenT(ctypes.Structure):
    """numpy's ``bitgen_t`` (numpy/random/bitgen.h)."""

    _fields_ = [
        ("state", ctypes.c_void_p),
        ("next_uint64", _U64_FN),
        ("next_uint32", _U32_FN),
        ("next_double", _DBL_FN),
        ("next_raw", _U64_FN),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
#: Kept alive for the process: the capsule stores a pointer to these bytes.
_CAPSULE_NAME = b"BitGenerator"


#: every live generator, so that a forked child can drop what its parent had buffered
_LIVE: weakref.WeakSet[UrandomBitGenerator] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for gen in list(_LIVE):
        gen._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class UrandomBitGenerator:
    """A numpy bit generator backed by ``os.urandom``, read 4 KiB at a time.

    Use it as ``numpy.random.Generator(UrandomBitGenerator())``. It has no
    seed and no state that could be saved or replayed. It is fork-safe: a
    forked child drops the words its parent had read ahead (the parent would
    draw them too) and starts from fresh ``os.urandom`` output.
    """

    def __init__(self) -> None:
        #: numpy's Generator serializes its draws on this lock.
        self.lock = threading.Lock()
        self._mutex = threading.Lock()
        self._words: tuple[int, ...] = ()
        self._pos = 0

        def next_uint64(_state: int) -> int:
            with self._mutex:
                pos = self._pos
                if pos >= len(self._words):
                    self._words = _UNPACK(os.urandom(8 * _WORDS))
                    pos = 0
                self._pos = pos + 1
                return self._words[pos]

        def next_uint32(_state: int) -> int:
            return next_uint64(0) >> 32

        def next_double(_state: int) -> float:
            return (next_uint64(0) >> 11) * _DOUBLE_SCALE

        self._callbacks = (_U64_FN(next_uint64), _U32_FN(next_uint32), _DBL_FN(next_double), _U64_FN(next_uint64))
        self._bitgen = _BitgenT(None, *self._callbacks)
        self.capsule = _capsule_new(ctypes.addressof(self._bitgen), _CAPSULE_NAME, None)
        _LIVE.add(self)

    def _forget(self) -> None:
        """Drop the read-ahead words (in a forked child); a mutex another thread held at the fork is replaced."""
        self._mutex = threading.Lock()
        self._words = ()
        self._pos = 0


def secure_generator() -> np.random.Generator:
    """A :class:`numpy.random.Generator` drawing from the OS CSPRNG."""
    return np.random.Generator(UrandomBitGenerator())  # type: ignore[arg-type]


def simulation_generator(seed: int) -> np.random.Generator:
    """A seeded (reproducible, *not* secure) generator, for simulations and tests only."""
    return np.random.default_rng(seed)
