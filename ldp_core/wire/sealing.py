"""Sealed reports: each privatized record encrypted to the analyzer's key (HPKE, RFC 9180).

A metric declared ``"sealed": true`` in the metrics file has each of its
records sealed on the device, so the collector, the raw topic and the
shuffler handle ciphertexts only; the analyzer's processes (the Parquet sink
and the streaming estimator), which hold the private key, open them after
the shuffle. See ``docs/SEALED.md`` for the threat model and the figures.

**One sealed record** (fixed width ``W = R + 52`` for a spec of record size
``R``)::

    offset size   field
    0      4      key id: the first 4 bytes of SHA-256("ldp-analyzer-key/1" || pkR)
    4      32     enc: the record's own ephemeral X25519 public key
    36     R + 16 AES-128-GCM ciphertext of the R-byte record, tag last

It is a single-shot HPKE base-mode message (DHKEM(X25519, HKDF-SHA256),
HKDF-SHA256, AES-128-GCM) with an empty aad and ``info`` =
:func:`sealed_info` ``(metric, spec_id, day, key_id)``: a record moved to
another metric, spec, day or key does not open. (The binding goes through
``info``, the key-schedule context, rather than the AEAD's aad: with one
context per record the two are equivalent, and ``info`` is what the
single-shot APIs, ``cryptography``'s included, take.)

**Per-record encapsulation** is deliberate: one HPKE context per upload
with sequence-numbered nonces would save 32 bytes a record, but every
record of the upload would then carry the same ``enc`` (or none, and a
shared context), and anyone after the shuffle could regroup an upload's
records by it, undoing the shuffle. A fresh ephemeral key per record
makes every record independent (``tests/sdk/test_sealed_attacks.py``).
The cost is one X25519 exchange per record on each side.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ldp_core.errors import FrameError, SpecError
from ldp_core.files import read_private
from ldp_core.mechanisms.base import ReportSpec

__all__ = [
    "KEY_ID_SIZE",
    "ENC_SIZE",
    "TAG_SIZE",
    "SEALED_OVERHEAD",
    "SealingError",
    "AnalyzerPublicKey",
    "AnalyzerKey",
    "KeyRing",
    "SealedSpec",
    "OpenResult",
    "key_id_of",
    "sealed_info",
    "seal_records",
    "seal_batch",
    "open_batch",
    "OPEN_STATUS",
    "native_opener_available",
    "ReplayGuard",
    "default_open_processes",
    "new_key_file",
    "load_key_file",
]

from ldp_core.wire.frames import ReportBatch
from ldp_core.wire.sealed import (
    ENC_SIZE,
    KEY_FILE_FORMAT,
    KEY_ID_SIZE,
    SEALED_OVERHEAD,
    TAG_SIZE,
    AnalyzerPublicKey,
    SealedSpec,
    SealingError,
    _sealed_dtype,
    key_id_of,
    sealed_info,
)


def seal_records(records: np.ndarray, metric: str, spec: ReportSpec, day: int, key: AnalyzerPublicKey) -> np.ndarray:
    """Seal each of ``records`` (of ``spec.record_dtype``) to ``key``, each under a fresh ephemeral key
    drawn from the OS CSPRNG; returns records of :attr:`SealedSpec.record_dtype`."""
    from ldp_core.wire import hpke

    recs = np.ascontiguousarray(records)
    if recs.dtype != spec.record_dtype:
        raise SpecError(f"records have dtype {recs.dtype}; spec {spec.name} needs {spec.record_dtype}")
    width = spec.record_size + SEALED_OVERHEAD
    info = sealed_info(metric, spec.spec_id, int(day), key.key_id)
    kid = bytes.fromhex(key.key_id)
    raw = recs.view(np.uint8).reshape(recs.size, spec.record_size)
    out = bytearray()
    fast = hpke.fast_suite()
    if fast is not None:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

        pk = X25519PublicKey.from_public_bytes(key.public_key)
        for row in raw:
            out += kid + fast.encrypt(row.tobytes(), pk, info)
    else:
        suite = hpke.Suite()
        for row in raw:
            out += kid + suite.seal(key.public_key, info, row.tobytes())
    if len(out) != width * recs.size:  # the AEAD's tag size is fixed: this cannot happen short of a broken library
        raise SealingError(f"sealing produced {len(out)} bytes for {recs.size} records of width {width}")
    return np.frombuffer(bytes(out), dtype=_sealed_dtype(width))


def seal_batch(batch: ReportBatch, key: AnalyzerPublicKey) -> ReportBatch:
    """``batch`` with every record sealed to ``key`` (same metric, day and batch id)."""
    if isinstance(batch.spec, SealedSpec):
        raise SealingError("the batch is sealed already")
    sealed = seal_records(batch.records, batch.metric, batch.spec, batch.day, key)
    return ReportBatch(batch.metric, SealedSpec.of(batch.spec), batch.day, sealed, batch.batch_id)


# -- analyzer side: keys -------------------------------------------------------------------------------------------


class AnalyzerKey:
    """An analyzer private key (X25519) and its id. Its repr never shows the key."""

    __slots__ = ("key_id", "public_key", "_private", "path")

    def __init__(self, private_bytes: bytes, path: str | None = None) -> None:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        if len(private_bytes) != 32:
            raise SealingError("an analyzer private key is 32 bytes (X25519)")
        self._private = X25519PrivateKey.from_private_bytes(private_bytes)
        self.public_key = self._private.public_key().public_bytes_raw()
        self.key_id = key_id_of(self.public_key)
        self.path = path

    def __repr__(self) -> str:
        return f"AnalyzerKey(key_id={self.key_id!r})"

    @property
    def public(self) -> AnalyzerPublicKey:
        return AnalyzerPublicKey(self.key_id, self.public_key)

    def private_bytes(self) -> bytes:
        return self._private.private_bytes_raw()

    @property
    def private(self) -> Any:
        return self._private


def new_key_file(folder: str | os.PathLike[str], *, clock: float | None = None) -> tuple[Path, AnalyzerKey]:
    """Create a new analyzer key pair in ``folder`` (created if missing, mode 0700): the private key in
    ``analyzer-<key_id>.key`` (mode 0600, never replaced) and the public entry in ``analyzer-<key_id>.pub.json``."""
    from ldp_core.files import makedirs_durable, write_atomic

    key = AnalyzerKey(os.urandom(32))
    d = Path(folder)
    makedirs_durable(d)
    os.chmod(d, 0o700)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock))
    doc = {
        "format": KEY_FILE_FORMAT,
        "key_id": key.key_id,
        "created": created,
        "private_key": key.private_bytes().hex(),
    }
    path = d / f"analyzer-{key.key_id}.key"
    write_atomic(path, (json.dumps(doc) + "\n").encode(), mode=0o600, replace=False)
    os.chmod(path, 0o600)  # whatever the umask
    pub = d / f"analyzer-{key.key_id}.pub.json"
    write_atomic(pub, (json.dumps(key.public.to_dict()) + "\n").encode(), mode=0o644)
    key.path = str(path)
    return path, key


def load_key_file(path: str | os.PathLike[str]) -> AnalyzerKey:
    """Read one private key file; a clear :class:`SealingError` if it is missing, readable by others, or malformed."""
    p = Path(path)
    try:
        data = read_private(p)
    except PermissionError as exc:
        raise SealingError(f"analyzer key file: {exc} (a private key must be readable by its owner only)") from None
    except OSError as exc:
        raise SealingError(f"cannot read analyzer key file {str(p)!r}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(data)
        if doc.get("format") != KEY_FILE_FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, expected {KEY_FILE_FORMAT!r}")
        key = AnalyzerKey(bytes.fromhex(doc["private_key"]), str(p))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SealingError(f"analyzer key file {str(p)!r} is malformed ({type(exc).__name__})") from None
    if doc.get("key_id") != key.key_id:
        raise SealingError(f"analyzer key file {str(p)!r} names key id {doc.get('key_id')!r}, its key is {key.key_id}")
    return key


class KeyRing(Mapping[str, AnalyzerKey]):
    """The analyzer's private keys by key id (current and retired ones: old records stay openable)."""

    def __init__(self, keys: Iterable[AnalyzerKey] = ()) -> None:
        self._keys: dict[str, AnalyzerKey] = {}
        for k in keys:
            self._keys[k.key_id] = k

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> KeyRing:
        """Every ``*.key`` file of ``folder``; a clear :class:`SealingError` if there is none or one is unusable."""
        d = Path(folder)
        if not d.is_dir():
            raise SealingError(
                f"analyzer key folder {str(d)!r} does not exist; create a key pair with `ldp keys new --dir {d}`"
            )
        try:
            files = sorted(d.glob("*.key"))
        except OSError as exc:
            raise SealingError(f"cannot list analyzer key folder {str(d)!r}: {exc}") from None
        if not files:
            raise SealingError(f"analyzer key folder {str(d)!r} holds no *.key file; run `ldp keys new --dir {d}`")
        return cls(load_key_file(f) for f in files)

    def __getitem__(self, key_id: str) -> AnalyzerKey:
        return self._keys[key_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"KeyRing({sorted(self._keys)})"

    def require(self, key_ids: Iterable[str], where: str = "the metrics file") -> None:
        """Fail at start-up, not at the first record, if a key that ``where`` names is missing here."""
        missing = sorted(set(key_ids) - set(self._keys))
        if missing:
            raise SealingError(
                f"{where} names analyzer key(s) {missing}, but the key folder holds only {sorted(self._keys)}: "
                "copy the private key file(s) here"
            )


# -- analyzer side: opening ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpenResult:
    """What opening a sealed batch gave: the opened batch (records of the inner spec) and how many did not open."""

    batch: ReportBatch
    failed: int
    replayed: int = 0  # opened records dropped because their encapsulated key was already counted


#: what became of each record, by the status byte :meth:`_Opener.open_raw_status` gives (the compiled opener,
#: ``native/opener``, numbers them the same way)
OPEN_STATUS = ("opened", "unknown_key", "bad_point", "not_authentic", "wrong_size", "short")
_OPENED, _UNKNOWN_KEY, _BAD_POINT, _NOT_AUTHENTIC, _WRONG_SIZE, _SHORT = range(6)


def native_opener_available() -> bool:
    """Whether the compiled batch opener (``ldp_opener``, built from ``native/opener`` by scripts/bootstrap)
    is installed; without it sealed records are opened in Python, with the same results."""
    try:
        import ldp_opener  # noqa: F401
    except ImportError:
        return False
    return True


def _native(keys: Mapping[str, Any], native: bool | None) -> Any:
    """A compiled opener for ``keys`` (key id -> (X25519PrivateKey, raw public)), or ``None``: ``native``
    None uses it when installed, False never, True requires it (a clear error if it is missing)."""
    if native is False:
        return None
    try:
        import ldp_opener
    except ImportError:
        if native:
            raise SealingError(
                "the compiled sealed-report opener (ldp_opener) is not installed: run scripts/bootstrap "
                "(it builds native/opener; needs cargo)"
            ) from None
        return None
    return ldp_opener.Opener([(bytes.fromhex(kid), sk.private_bytes_raw()) for kid, (sk, _) in keys.items()])


class _Opener:
    """Opens sealed records of one (metric, spec, day): one X25519 exchange, five HMACs and one AES-GCM each.

    With the compiled opener (``ldp_opener``, when installed, unless ``native=False``) a whole batch is one
    call that releases the GIL; else each record goes through :func:`ldp_core.wire.hpke.single_shot_opener`
    (every constant of the key schedule precomputed per key id). Both give the same plaintexts and the same
    status per record (``tests/sdk/test_sealed_native.py``)."""

    def __init__(self, keys: Mapping[str, Any], native: bool | None = None) -> None:
        from ldp_core.wire import hpke

        self.keys = keys  # key id -> (X25519PrivateKey, raw public)
        self.suite = hpke.Suite()
        self._openers: dict[tuple[bytes, bytes], Any] = {}
        self._native = _native(keys, native)

    @property
    def native(self) -> bool:
        """Whether this opener opens with the compiled one."""
        return self._native is not None

    def _opener(self, kid: bytes, metric: str, spec_id: str, day: int) -> Any:
        from ldp_core.wire import hpke

        if len(kid) != KEY_ID_SIZE:  # what is left of a cut record: no key has such an id
            return None
        info = sealed_info(metric, spec_id, day, kid.hex())
        op = self._openers.get((kid, info))
        if op is None:
            entry = self.keys.get(kid.hex())
            op = None if entry is None else hpke.single_shot_opener(self.suite, entry[0], entry[1], info)
            if len(self._openers) > 1024:
                self._openers.clear()
            self._openers[(kid, info)] = op
        return op

    def open_raw(self, raw: np.ndarray, metric: str, spec_id: str, day: int, plain_size: int) -> tuple[bytes, int]:
        """``raw`` is an (n, W) uint8 array; returns the concatenated plaintexts and the count that failed."""
        plain, failed, _ = self.open_raw_keyed(raw, metric, spec_id, day, plain_size)
        return plain, failed

    def open_raw_keyed(
        self, raw: np.ndarray, metric: str, spec_id: str, day: int, plain_size: int
    ) -> tuple[bytes, int, bytes]:
        """As :meth:`open_raw`, plus the encapsulated keys (``ENC_SIZE`` bytes each) of the records that opened."""
        plain, encs, status = self.open_raw_status(raw, metric, spec_id, day, plain_size)
        return plain, len(status) - status.count(_OPENED), encs

    def open_raw_status(
        self, raw: np.ndarray | bytes, metric: str, spec_id: str, day: int, plain_size: int
    ) -> tuple[bytes, bytes, bytes]:
        """The plaintexts and encapsulated keys of the records that opened (concatenated, in order) and one
        status byte per record (an index into :data:`OPEN_STATUS`). ``raw`` is an (n, W) uint8 array, or
        bytes of records ``plain_size + SEALED_OVERHEAD`` wide (a shorter last one is tried as it is)."""
        if isinstance(raw, np.ndarray):
            data = np.ascontiguousarray(raw).tobytes()
            width = raw.shape[1] if raw.ndim == 2 else plain_size + SEALED_OVERHEAD
        else:
            data, width = bytes(raw), plain_size + SEALED_OVERHEAD
        if self._native is not None:
            infos = [(bytes.fromhex(kid), sealed_info(metric, spec_id, day, kid)) for kid in self.keys]
            plain, encs, status = self._native.open(data, width, plain_size, infos)
            return bytes(plain), bytes(encs), bytes(status)
        return self._open_python(data, width, metric, spec_id, day, plain_size)

    def _open_python(
        self, data: bytes, width: int, metric: str, spec_id: str, day: int, plain_size: int
    ) -> tuple[bytes, bytes, bytes]:
        from ldp_core.wire.hpke import HPKEError, HPKEPointError

        out: list[bytes] = []
        encs: list[bytes] = []
        status = bytearray()
        last_kid, op = b"", None
        for pos in range(0, len(data), width):
            kid = data[pos : pos + KEY_ID_SIZE]
            if kid != last_kid:
                last_kid, op = kid, self._opener(kid, metric, spec_id, day)
            if op is None:  # a key this analyzer does not have
                status.append(_UNKNOWN_KEY)
                continue
            msg = data[pos + KEY_ID_SIZE : pos + width]
            if len(msg) < ENC_SIZE + TAG_SIZE:
                status.append(_SHORT)
                continue
            try:
                pt = op(msg)
            except HPKEPointError:  # a low-order enc: counted, never fatal
                status.append(_BAD_POINT)
                continue
            except HPKEError:  # a wrong tag: altered bytes, another metric, spec, day or key
                status.append(_NOT_AUTHENTIC)
                continue
            if len(pt) != plain_size:
                status.append(_WRONG_SIZE)
                continue
            status.append(_OPENED)
            out.append(pt)
            encs.append(msg[:ENC_SIZE])
        return b"".join(out), b"".join(encs), bytes(status)


def _key_table(keys: Mapping[str, AnalyzerKey]) -> dict[str, Any]:
    return {kid: (k.private, k.public_key) for kid, k in keys.items()}


_WORKER: _Opener | None = None


def _worker_init(private_keys: list[bytes], native: bool | None = None) -> None:
    global _WORKER
    _WORKER = _Opener(_key_table({k.key_id: k for k in (AnalyzerKey(b) for b in private_keys)}), native)


def _worker_open(args: tuple[bytes, int, str, str, int, int]) -> tuple[bytes, int, bytes]:
    data, width, metric, spec_id, day, plain_size = args
    assert _WORKER is not None
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    return _WORKER.open_raw_keyed(raw, metric, spec_id, day, plain_size)


class ReplayGuard:
    """Which sealed records were already counted, per (metric, day), by their encapsulated key.

    Every sealed record carries its own ephemeral X25519 key (``ENC_SIZE`` bytes); a replayed copy
    must carry the same one, since any other key fails to open. A record is a replay when its key was
    first opened from another *source* (a different log record: topic, partition, offset); the same
    source seen again is a redelivery after a rebalance or a restart and is let through, because the
    consumer threw away what it had counted from it. ``source=None`` makes every call a new source.

    The set is bounded by the day window: per metric, days older than the newest day opened minus
    ``max_day_age`` are forgotten (the collector refuses such days anyway).
    """

    def __init__(self, max_day_age: int | None = None, path: str | Path | None = None) -> None:
        from ldp_core.days import DEFAULT_MAX_DAY_AGE

        self.max_day_age = DEFAULT_MAX_DAY_AGE if max_day_age is None else int(max_day_age)
        self._seen: dict[tuple[str, int], dict[bytes, object]] = {}
        self._newest: dict[str, int] = {}
        self.dropped = 0
        self._db: Any = None
        if path is not None:
            self.attach(path)

    def attach(self, path: str | Path) -> None:
        """Keep the set in the SQLite file ``path`` (made if missing) instead of in memory, so that it
        outlives the process: sources are then compared by their ``repr``."""
        import sqlite3

        from ldp_core.sqlite import use_wal

        db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        use_wal(db, 5.0)
        db.execute(
            "CREATE TABLE IF NOT EXISTS sealed_seen (metric TEXT NOT NULL, day INTEGER NOT NULL, "
            "enc BLOB NOT NULL, source TEXT NOT NULL, PRIMARY KEY (metric, day, enc)) WITHOUT ROWID"
        )
        self._db = db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __len__(self) -> int:
        if self._db is not None:
            return int(self._db.execute("SELECT COUNT(*) FROM sealed_seen").fetchone()[0])
        return sum(len(v) for v in self._seen.values())

    def _prune(self, metric: str, day: int) -> None:
        newest = self._newest.get(metric)
        if newest is not None and day <= newest:
            return
        self._newest[metric] = day
        for key in [k for k in self._seen if k[0] == metric and k[1] < day - self.max_day_age]:
            del self._seen[key]
        if self._db is not None:
            self._db.execute("DELETE FROM sealed_seen WHERE metric = ? AND day < ?", (metric, day - self.max_day_age))

    def _firsts(self, metric: str, day: int, keys: list[bytes], src: object) -> dict[bytes, object]:
        """For each key, the source it was first opened from (``src`` for the new ones), recording them."""
        if self._db is None:
            seen = self._seen.setdefault((metric, day), {})
            return {e: seen.setdefault(e, src) for e in keys}
        from ldp_core.sqlite import immediate_transaction

        uniq = list(dict.fromkeys(keys))
        tag = repr(src)
        out: dict[bytes, object] = {}
        with immediate_transaction(self._db) as db:
            db.executemany(
                "INSERT OR IGNORE INTO sealed_seen (metric, day, enc, source) VALUES (?, ?, ?, ?)",
                [(metric, day, e, tag) for e in uniq],
            )
            for i in range(0, len(uniq), 500):
                part = uniq[i : i + 500]
                marks = ",".join("?" * len(part))
                rows = db.execute(
                    f"SELECT enc, source FROM sealed_seen WHERE metric = ? AND day = ? AND enc IN ({marks})",
                    (metric, day, *part),
                )
                out.update((bytes(e), s) for e, s in rows)
        return {e: (src if out[e] == tag else out[e]) for e in keys}

    def keep(self, metric: str, day: int, encs: bytes, source: object | None = None) -> np.ndarray:
        """A boolean mask over the records whose concatenated encapsulated keys are ``encs``:
        ``False`` for a replay (also within this one call); the replays are added to :attr:`dropped`."""
        n = len(encs) // ENC_SIZE
        self._prune(metric, day)
        src = object() if source is None and self._db is None else (source or secrets.token_hex(16))
        keys = [encs[i * ENC_SIZE : (i + 1) * ENC_SIZE] for i in range(n)]
        firsts = self._firsts(metric, day, keys, src) if n else {}
        ok = np.ones(n, dtype=bool)
        here: set[bytes] = set()
        for i, e in enumerate(keys):
            if firsts[e] != src or e in here:
                ok[i] = False
            here.add(e)
        self.dropped += int(n - np.count_nonzero(ok))
        return ok


def default_open_processes() -> int:
    """How many processes open large sealed batches by default: one per CPU this process may run on when
    there are several (opening is one X25519 exchange per report, CPU-bound), else 1 (inline)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, cpus)


class BatchOpener:
    """Opens sealed batches with the keys of a :class:`KeyRing`, inline or across ``processes`` workers.

    The compiled opener releases the GIL for a whole batch, so with it the
    workers are threads of this process and a batch of ``2 * thread_part``
    records or more is split among them; the Python opener holds the GIL,
    so its workers are processes and only batches over ``chunk`` records
    go to them (pickling a batch costs more than opening a small one).

    Records that do not open (another key, another metric or day, altered
    bytes) are dropped and counted in :attr:`OpenResult.failed`; so are
    opened records the spec rejects (out-of-range fields).

    ``native`` picks the opener: ``None`` (the default) the compiled one
    (``ldp_opener``) when it is installed, else Python; ``False`` Python;
    ``True`` the compiled one or a :class:`SealingError`. The worker
    processes open the same way.
    """

    def __init__(
        self,
        keys: KeyRing,
        *,
        processes: int = 1,
        chunk: int = 4096,
        replays: ReplayGuard | None = None,
        native: bool | None = None,
        thread_part: int = 256,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        if thread_part < 1:
            raise ValueError(f"thread_part must be >= 1, got {thread_part}")
        self.keys = keys
        self.processes = int(processes)
        self.chunk = int(chunk)
        self.thread_part = int(thread_part)
        self._threads: Any = None
        self._opener = _Opener(_key_table(keys), native)
        # the workers open as this process does: compiled if it is, else in Python
        self._native_mode: bool | None = self._opener.native if native is None else native
        self._pool: Any = None
        self.replays = ReplayGuard() if replays is None else replays

    def _get_pool(self) -> Any:
        if self._pool is None:
            import multiprocessing

            ctx = multiprocessing.get_context("spawn")
            privs = [k.private_bytes() for k in self.keys.values()]
            self._pool = ctx.Pool(self.processes, initializer=_worker_init, initargs=(privs, self._native_mode))
        return self._pool

    @property
    def native(self) -> bool:
        """Whether records are opened by the compiled opener (``ldp_opener``) rather than in Python."""
        return self._opener.native

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    def _open_threaded(
        self, raw: np.ndarray, metric: str, spec_id: str, day: int, plain_size: int
    ) -> tuple[bytes, int, bytes]:
        """Open ``raw`` in up to ``processes`` contiguous parts on threads (the compiled opener only: it
        releases the GIL), joined back in order."""
        if self._threads is None:
            from concurrent.futures import ThreadPoolExecutor

            self._threads = ThreadPoolExecutor(self.processes, thread_name_prefix="ldp-open")
        n = raw.shape[0]
        k = min(self.processes, n // self.thread_part)
        bounds = [n * i // k for i in range(k + 1)]
        parts = list(
            self._threads.map(
                lambda ab: self._opener.open_raw_status(raw[ab[0] : ab[1]], metric, spec_id, day, plain_size),
                zip(bounds[:-1], bounds[1:], strict=True),
            )
        )
        status = b"".join(st for _, _, st in parts)
        return b"".join(p for p, _, _ in parts), len(status) - status.count(_OPENED), b"".join(e for _, e, _ in parts)

    def __enter__(self) -> BatchOpener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open_records(self, records: np.ndarray, metric: str, spec: ReportSpec, day: int) -> tuple[np.ndarray, int]:
        """Plain records of ``spec`` (in the sealed records' order) and the number that failed (no replay check)."""
        plain, failed, _ = self.open_records_keyed(records, metric, spec, day)
        return plain, failed

    def open_records_keyed(
        self, records: np.ndarray, metric: str, spec: ReportSpec, day: int
    ) -> tuple[np.ndarray, int, bytes]:
        """As :meth:`open_records`, plus the encapsulated keys of the plain records (``ENC_SIZE`` bytes each)."""
        width = spec.record_size + SEALED_OVERHEAD
        raw = np.ascontiguousarray(records).view(np.uint8).reshape(-1, width)
        n = raw.shape[0]
        if self.processes > 1 and self._opener.native and n >= 2 * self.thread_part:
            data, failed, encs = self._open_threaded(raw, metric, spec.spec_id, day, spec.record_size)
        elif self.processes > 1 and n > self.chunk:
            pool = self._get_pool()
            jobs = [
                (raw[i : i + self.chunk].tobytes(), width, metric, spec.spec_id, day, spec.record_size)
                for i in range(0, n, self.chunk)
            ]
            parts = pool.map(_worker_open, jobs)
            data = b"".join(p for p, _, _ in parts)
            failed = sum(f for _, f, _ in parts)
            encs = b"".join(e for _, _, e in parts)
        else:
            data, failed, encs = self._opener.open_raw_keyed(raw, metric, spec.spec_id, day, spec.record_size)
        plain = np.frombuffer(data, dtype=spec.record_dtype)
        try:
            spec.check_records(plain)
        except FrameError:  # opened, but not a record of this spec: keep the valid ones, count the rest
            ok = np.ones(plain.size, dtype=bool)
            for i in range(plain.size):
                try:
                    spec.check_records(plain[i : i + 1])
                except FrameError:
                    ok[i] = False
            failed += int(np.count_nonzero(~ok))
            plain = plain[ok]
            e = np.frombuffer(encs, dtype=np.uint8).reshape(-1, ENC_SIZE)
            encs = e[ok].tobytes()
        return plain, failed, encs

    def open_batch(self, batch: ReportBatch, source: object | None = None) -> OpenResult:
        """Open ``batch``; records whose encapsulated key :attr:`replays` already counted from another
        ``source`` (see :class:`ReplayGuard`) are dropped and counted in :attr:`OpenResult.replayed`."""
        spec = batch.spec
        if not isinstance(spec, SealedSpec):
            return OpenResult(batch, 0)
        inner = spec.inner
        plain, failed, encs = self.open_records_keyed(batch.records, batch.metric, inner, batch.day)
        keep = self.replays.keep(batch.metric, batch.day, encs, source)
        replayed = int(keep.size - np.count_nonzero(keep))
        if replayed:
            plain = plain[keep]
        return OpenResult(ReportBatch(batch.metric, inner, batch.day, plain, batch.batch_id), failed, replayed)


def open_batch(batch: ReportBatch, keys: KeyRing) -> OpenResult:
    """Open ``batch`` inline (see :class:`BatchOpener`); a plain batch comes back as is."""
    return BatchOpener(keys).open_batch(batch)
