"""Memoized permanent randomization, keyed so the store holds no plaintext.

Averaging attack: if a device reports the same true value every day with
fresh randomness, an observer who averages its reports over many days
recovers the value, whatever the per-report ε. RAPPOR (Erlingsson, Pihur
and Korolova, CCS 2014, Sec. 3) defends with a *permanent* randomized
response (PRR) drawn once per distinct value and reused forever, and a
fresh *instantaneous* randomized response (IRR) on top of it per report:
however many reports an observer collects, they reveal no more about the
value than the PRR does (ε_∞ of the paper).

:class:`MemoStore` memoizes by *derivation* instead of storage: the PRR is
a keyed pseudorandom function of the value under a per-metric key derived
from a 32-byte device secret, so the same value always gets the same
permanent bits and the storage directory holds no value, no index and no
table of permanent bits that could be joined with a dictionary of candidate
values. The secret lives in ``<storage>/device_secret``, created with
``secrets.token_bytes`` and mode 0600; it never leaves the device.
(Someone who can read the secret can test candidate values against
reports: on-device attackers are out of scope.)

**Pins.** The PRR is a function of the *definition* as well as the value:
the metric key, the cohort and the permanent bits all depend on the spec's
memo derivation id, and the value's index on the domain. A server that changes any
of them (a new ``hash_seed`` or hashed-domain ``seed`` every day, each
definition within the local policy) would get a fresh PRR of the same value
every day, and enough fresh PRRs reveal the value as surely as fresh
reports. So the first report of a memoized metric *pins* its definition
(:func:`definition_pin`: the whole mechanism spec and the domain) in the
store's ``pins`` table, in the transaction that spends and queues that
report; pins are never changed or removed. A later definition of the metric
that differs from its pin is refused by the client (docs/SDK.md, "Pinned
definitions"). Keying the PRR to the raw value instead would not help: a
PRR is a Bloom filter under the spec's hashes and bit count, and no PRR
drawn under one definition can be carried over to another, so *any*
definition change needs a fresh one.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import Iterable

import numpy as np

from ldp_core.canonical import canonical_json
from ldp_core.files import load_or_create_private
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricDefinition

__all__ = [
    "MemoStore",
    "load_or_create_secret",
    "SECRET_FILENAME",
    "SECRET_BYTES",
    "definition_pin",
    "load_pins",
    "read_pins_in",
    "insert_pin_in",
]

SECRET_FILENAME = "device_secret"
SECRET_BYTES = 32


def load_or_create_secret(directory: str) -> bytes:
    """The device secret in ``directory``, created on first use (0600, atomically).

    Two processes starting together agree on one secret: it is written to a
    private temporary file and hard-linked into place, which fails if the
    name already exists (:func:`~ldp_core.files.write_atomic` with
    ``replace=False``); the loser reads the winner's file.
    """
    return load_or_create_private(os.path.join(directory, SECRET_FILENAME), SECRET_BYTES)


class MemoStore:
    """Memoized randomized responses for one device, derived from its secret.

    RAPPOR's permanent randomized response is a pure function of (secret,
    spec, value) (:meth:`RapporSpec.permanent_bits
    <ldp_core.mechanisms.rappor.RapporSpec.permanent_bits>`, an HMAC-SHA256
    keystream), so memoizing it needs no table at all: the "memo" is the
    keyed function, and nothing about recorded values is ever written. Each
    metric gets its own key, ``BLAKE2b(key=device secret, metric ‖ spec id)``,
    so two metrics with the same spec do not share permanent bits or cohorts.
    """

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
            raise ValueError(f"the device secret must be {SECRET_BYTES} bytes")
        self._secret = secret
        self._keys: dict[tuple[str, str], bytes] = {}

    def metric_secret(self, metric: str, spec_id: str) -> bytes:
        """The 32-byte key of ``metric`` under spec ``spec_id``: keyed BLAKE2b (RFC 7693)."""
        key = self._keys.get((metric, spec_id))
        if key is None:
            msg = f"{metric}\x00{spec_id}".encode()
            key = hashlib.blake2b(msg, key=self._secret, digest_size=32, person=b"ldp-prr-v1").digest()
            self._keys[(metric, spec_id)] = key
        return key

    @staticmethod
    def supports(spec: ReportSpec) -> bool:
        """Whether ``spec`` has a memoized encoder (``encode_memoized``)."""
        return callable(getattr(spec, "encode_memoized", None))

    def encode(self, metric: str, spec: ReportSpec, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Reports of this device for ``indices``: permanent bits memoized per value,
        fresh instantaneous randomness from ``rng`` per report."""
        key = self.metric_secret(metric, spec.memo_derivation_id)  # see ReportSpec.memo_derivation_id
        return spec.encode_memoized(indices, key, rng)  # type: ignore[attr-defined]


def definition_pin(metric: MetricDefinition) -> str:
    """What a memoized metric's permanent responses depend on, as RFC 8785 JSON:
    ``{"domain": domain.to_dict(), "mechanism": spec.to_dict()}``.

    The whole spec, not only the fields the PRR reads (bits, hashes, cohorts,
    hash seed, ε hence f): the memo key, the cohort and the keystream are all
    keyed by the spec's memo derivation id, a hash of every field, so a change of p or
    q draws a fresh PRR too. The domain decides the index a value maps to.
    Not pinned: owner, description, expiry and ``max_reports_per_day``, which
    the permanent response does not depend on (the budget ledger caps r)."""
    doc = {"domain": metric.domain.to_dict(), "mechanism": metric.spec.to_dict()}
    return canonical_json(doc).decode("utf-8")


def load_pins(conn: sqlite3.Connection) -> dict[str, str]:
    """Every pin in the store: metric name -> :func:`definition_pin`."""
    return {str(m): str(d) for m, d in conn.execute("SELECT metric, definition FROM pins")}


def read_pins_in(conn: sqlite3.Connection, metrics: Iterable[str]) -> dict[str, str]:
    """The pins of ``metrics`` (those that have one), read inside the caller's transaction."""
    names = sorted(set(metrics))
    out: dict[str, str] = {}
    for i in range(0, len(names), 500):  # below SQLite's limit on bound parameters
        chunk = names[i : i + 500]
        rows = conn.execute(
            f"SELECT metric, definition FROM pins WHERE metric IN ({','.join('?' * len(chunk))})", chunk
        )
        out.update({str(m): str(d) for m, d in rows})
    return out


def insert_pin_in(conn: sqlite3.Connection, metric: str, pin: str, now: float) -> str:
    """Pin ``metric`` to ``pin`` unless it has a pin already; return the pin in force (the caller's
    transaction decides: another process may have pinned first)."""
    conn.execute("INSERT OR IGNORE INTO pins (metric, definition, pinned) VALUES (?, ?, ?)", (metric, pin, now))
    row = conn.execute("SELECT definition FROM pins WHERE metric = ?", (metric,)).fetchone()
    return str(row[0])
