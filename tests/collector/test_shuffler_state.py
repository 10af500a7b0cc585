"""The shuffler's state topic must not undo the shuffle: an attacker holding it (every record ever written to it,
tapped as it was written) and the shuffled topic links released reports to their uploads no better than chance.

Also: no raw batch id reaches the state topic, superseded checkpoints are deleted (reading the topic from the
beginning yields only the latest checkpoint), the embedded log overwrites their bytes, and a member with
another key refuses to restore instead of losing reports.
"""

from __future__ import annotations

import itertools
import math
import sqlite3
import uuid
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from collector.errors import ConfigError, ShufflerStateError
from collector.shuffler import Shuffler
from collector.shuffler.checkpoint import decode_checkpoint_chunk
from collector.shuffler.groups import _IdWindow
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import ReportBatch
from ldp_core.wire.framing import FramingError, pack_headed
from pipeline.envelope import decode_envelope
from pipeline.transport import Consumer, Record, Transport, open_transport
from tests.collector.test_shuffler import Topics, publish, read_shuffled
from tests.support.collector_support import olh_batch, write_metrics

#: uploads, reports per upload, uploads arriving between two checkpoints
UPLOADS, PER_UPLOAD, PER_ROUND = 120, 5, 10
#: the linking test's false-alarm probability per run (:func:`linking_attack`)
FALSE_ALARM = 1e-6


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    tr = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")
    yield tr
    tr.close()


class Tap:
    """The attacker's reader of the state topic: its own consumer group, polled after every checkpoint, keeping
    every record it ever saw (before the shuffler deletes it)."""

    def __init__(self, transport: Transport, topic: str) -> None:
        self.consumer: Consumer = transport.consume(topic, f"tap-{uuid.uuid4().hex[:8]}", session_timeout=10.0)
        self.seen: dict[tuple[int, int], Record] = {}

    def drain(self) -> None:
        while True:
            recs = self.consumer.poll(max_records=1000, timeout=0.5)
            if not recs:
                return
            for r in recs:
                self.seen[(r.partition, r.offset)] = r

    def records(self) -> list[Record]:
        return [self.seen[k] for k in sorted(self.seen)]


def settle(sh: Shuffler, until: int) -> None:
    """Step until ``until`` input reports were applied, then commit a checkpoint."""
    for _ in range(400):
        if sh.stats.input_reports + sum(p.delta["input_reports"] for p in sh._parts.values()) >= until:
            break
        sh.step(timeout=0.05)
    else:
        pytest.fail(f"the shuffler did not apply {until} reports")
    assert sh.checkpoint(force=True)


def feed_and_tap(
    transport: Transport, tp: Topics, metrics: MetricSet
) -> tuple[list[ReportBatch], list[Record], list[ReportBatch]]:
    """``UPLOADS`` uploads of one metric-day, ``PER_ROUND`` at a time, a committed checkpoint after each round
    (so 12 checkpoints before the group reaches its crowd of ``UPLOADS * PER_UPLOAD`` and is released whole).
    Returns the uploads (in arrival order), every state record the tap saw, and the released batches."""
    uploads = [olh_batch(metrics, PER_UPLOAD, first_seed=PER_UPLOAD * i) for i in range(UPLOADS)]
    # OLH seeds identify reports; make them look like real ones (random 32-bit), distinct
    seeds = np.random.default_rng(7).choice(2**32 - 1, size=UPLOADS * PER_UPLOAD, replace=False).astype(np.uint32)
    for i, b in enumerate(uploads):
        b.records["seed"] = seeds[PER_UPLOAD * i : PER_UPLOAD * (i + 1)]
    transport.create_topic(tp.raw, 4)
    sh = Shuffler(
        transport,
        metrics,
        tp.settings(min_batch=UPLOADS * PER_UPLOAD, max_batch=UPLOADS * PER_UPLOAD, checkpoint_interval=1e6),
    )
    sh.open()
    tap = Tap(transport, tp.state)
    try:
        for r in range(0, UPLOADS, PER_ROUND):
            publish(transport, tp.raw, uploads[r : r + PER_ROUND])
            settle(sh, (r + PER_ROUND) * PER_UPLOAD)
            tap.drain()
        for _ in range(20):  # read the last checkpoints back (and delete what they supersede)
            sh.step(timeout=0.05)
        tap.drain()
        assert sh.stats.checkpoints >= UPLOADS // PER_ROUND
    finally:
        sh.close()
        tap.consumer.close()
    released = [sb.batch for _, sb in read_shuffled(transport, tp.shuffled, metrics, expect=UPLOADS * PER_UPLOAD)]
    return uploads, tap.records(), released


def link(state: list[Record], released: list[ReportBatch], rng: np.random.Generator) -> np.ndarray:
    """The attacker: for each released report (in released order), a guess of its upload's arrival number.

    Whatever the checkpoint format, a report whose bytes appear in a checkpoint's payload was buffered then:
    the first checkpoint holding it tells the round it arrived in, and its place among that round's new
    reports (in the payload's order) tells which upload of the round it came from, if checkpoints keep the
    arrival order. Where a report's bytes appear in no checkpoint, the guess is uniform over all uploads.
    """
    snaps: dict[str, list[bytes]] = {}
    for r in state:  # in offset order: a snapshot's chunks are consecutive, snapshots in the order written
        snaps.setdefault(decode_checkpoint_chunk(r.value)[0].snapshot, []).append(bytes(r.value))
    payloads = [b"".join(chunks) for chunks in snaps.values()]
    rows = [
        row.tobytes()
        for b in released
        for row in np.ascontiguousarray(b.records).view(np.uint8).reshape(len(b), b.records.dtype.itemsize)
    ]
    where = np.array([[p.find(row) for p in payloads] for row in rows]).reshape(len(rows), len(payloads))
    guesses = np.empty(len(rows), dtype=np.int64)
    for i in range(len(rows)):
        seen = np.flatnonzero(where[i] >= 0)
        if seen.size == 0:
            guesses[i] = rng.integers(UPLOADS)
            continue
        first = int(seen[0])
        new = np.flatnonzero((where[:, first] >= 0) & ((where[:, :first] < 0).all(axis=1)))  # this round's arrivals
        rank = int(np.count_nonzero(where[new, first] < where[i, first]))
        guesses[i] = min(UPLOADS - 1, first * PER_ROUND + rank // PER_UPLOAD)  # round `first` brought these uploads
    return guesses


def truth(uploads: list[ReportBatch], released: list[ReportBatch]) -> np.ndarray:
    upload_of = {int(s): i for i, b in enumerate(uploads) for s in b.records["seed"]}
    return np.array([upload_of[int(s)] for b in released for s in b.records["seed"]])


def matches_law(guesses: np.ndarray, per_upload: int) -> Iterator[int]:
    """``N_j`` for ``j = 0, 1, .., n`` (lazily): how many of the ``n!`` orders of the released reports give
    ``W = j`` matches.

    ``W`` counts the released positions ``i`` whose guess ``g_i`` names the upload of the report released
    there. Under the null the guesses are fixed (nothing the attacker reads changes its seeded fallback
    draws) and the released order is a uniform permutation (the shuffler's CSPRNG), so ``W`` is the number
    of matches between the guesses and a well-shuffled deck holding each upload label ``m = per_upload``
    times: ``P(W = j) = N_j / n!``. Number the ``n`` reports; the cells (position ``i``, report ``j``) with
    ``label(j) = g_i`` form disjoint blocks of ``a_u × m`` cells (``a_u`` = the guesses naming upload ``u``),
    so their rook numbers (ways to pick ``k`` cells, no two in a row or column) are the coefficients of
    ``R(x) = Π_u Σ_k C(a_u, k)·C(m, k)·k!·x^k``, and inclusion and exclusion over the matched cells (Kaplansky
    and Riordan, "The problem of the rooks and its applications", 1946) give
    ``N_j = Σ_{k≥j} (−1)^(k−j)·C(k, j)·r_k·(n − k)!``, computed here in exact integers.
    """
    n = guesses.size
    rooks = [1]
    for a in np.bincount(guesses).tolist():
        block = [math.comb(a, k) * math.comb(per_upload, k) * math.factorial(k) for k in range(min(a, per_upload) + 1)]
        product = [0] * (len(rooks) + len(block) - 1)
        for i, r in enumerate(rooks):
            for k, b in enumerate(block):
                product[i + k] += r * b
        rooks = product
    terms = [r * math.factorial(n - k) for k, r in enumerate(rooks)] + [0] * (n + 1 - len(rooks))
    return (sum((-1) ** (k - j) * math.comb(k, j) * terms[k] for k in range(j, n + 1)) for j in range(n + 1))


def null_bound(guesses: np.ndarray, per_upload: int, alpha: float) -> int:
    """The smallest ``c`` with ``P(W > c) < alpha`` under the null (:func:`matches_law`), exactly."""
    orders = math.factorial(guesses.size)
    below = 0  # orders with W <= c
    for c, count in enumerate(matches_law(guesses, per_upload)):
        below += count
        if orders - below < Fraction(alpha) * orders:
            return c
    raise AssertionError("unreachable: P(W > n) = 0")


def test_the_law_of_chance_matches_counts_every_order() -> None:
    """:func:`matches_law` against all 8! orders of a small deck (4 uploads of 2 reports, uneven guesses)."""
    guesses = np.array([0, 0, 0, 1, 2, 2, 3, 3])
    labels = [0, 0, 1, 1, 2, 2, 3, 3]
    counts = [0] * 9
    for order in itertools.permutations(labels):
        counts[sum(g == t for g, t in zip(guesses.tolist(), order, strict=True))] += 1
    assert list(matches_law(guesses, 2)) == counts and sum(counts) == math.factorial(8)


def linking_attack(transport: Transport, metrics: MetricSet) -> None:
    """Statistic: the number ``W`` of the N = 600 released reports whose upload (of U = 120, 5 reports each)
    the attacker names correctly; chance is N/U = 5. The test fails when ``W`` exceeds the bound that a
    state topic carrying nothing about the link exceeds with probability below ``FALSE_ALARM`` = 1e-6 per run
    (:func:`null_bound`: W's exact law given the attacker's guesses, over the uniform released order).

    For the guesses of the fixed seed the bound is 19: P(W ≥ 20) = 2.9e-7, P(W ≥ 19) = 1.2e-6. (Binomial(N,
    1/U), W's law were the guesses drawn afresh each run, gives the same 19; with the guesses fixed the exact
    tail is slightly heavier than the binomial's, so the binomial is not a bound here. The 99.9% binomial
    quantile used before, 13, is exceeded with probability 6.6e-4 per run: once seen, with 14.) The test
    keeps its power: on the old checkpoints (arrival order, upload numbers) this attacker names about 552
    of 600, and on permuted but unsealed ones about 1 in PER_ROUND (the round is still given away): about 50,
    and were W Binomial(600, 1/12) it would stay at or below 19 with probability 2e-7.
    """
    tp = Topics()
    uploads, state, released = feed_and_tap(transport, tp, metrics)
    assert len(state) >= UPLOADS // PER_ROUND  # the tap saw every checkpoint
    assert sum(len(b) for b in released) == UPLOADS * PER_UPLOAD
    guesses = link(state, released, np.random.default_rng(11))
    correct = int(np.count_nonzero(guesses == truth(uploads, released)))
    n = guesses.size
    bound = null_bound(guesses, PER_UPLOAD, FALSE_ALARM)
    assert correct <= bound, f"the attacker linked {correct} of {n} reports (chance {n / UPLOADS:.1f}, bound {bound})"


def test_state_topic_does_not_link_reports_to_uploads_embedded(metrics: MetricSet, transport: Transport) -> None:
    linking_attack(transport, metrics)


@pytest.mark.kafka
def test_state_topic_does_not_link_reports_to_uploads_kafka(metrics: MetricSet, kafka_bootstrap: str) -> None:
    with open_transport(f"kafka://{kafka_bootstrap}") as tr:
        linking_attack(tr, metrics)


def test_no_raw_batch_id_reaches_the_state_topic(metrics: MetricSet, transport: Transport) -> None:
    tp = Topics()
    uploads, state, _ = feed_and_tap(transport, tp, metrics)
    blob = b"".join(bytes(r.value) for r in state)
    found = [b.batch_id.hex() for b in uploads if b.batch_id in blob]
    assert not found, f"{len(found)} of {len(uploads)} raw batch ids are in the state topic"


# -- superseded checkpoints are deleted ------------------------------------------------------------------


def only_latest_checkpoint(transport: Transport, metrics: MetricSet) -> None:
    """After N checkpoints of a partition, the state topic read from the beginning holds exactly one: the latest."""
    tp = Topics()
    transport.create_topic(tp.raw, 4)
    sh = Shuffler(transport, metrics, tp.settings(min_batch=10_000, max_batch_bytes=4096, checkpoint_interval=1e6))
    sh.open()
    n = 0
    try:
        for i in range(8):  # 8 checkpoints of one partition, each of several chunks (4 KiB each)
            publish(transport, tp.raw, [olh_batch(metrics, 300, first_seed=300 * i)])
            n += 300
            settle(sh, n)
        for _ in range(20):
            sh.step(timeout=0.05)
        (part,) = [p for p in sh._parts.values() if p.groups]
        latest = part.latest
        assert sh.stats.superseded_deletes >= 1
    finally:
        sh.close()
    with transport.consume(tp.state, f"reader-{uuid.uuid4().hex[:8]}", session_timeout=10.0) as c:
        recs: list[Record] = c.poll(max_records=1000, timeout=30.0)  # the first poll joins the group
        while got := c.poll(max_records=1000, timeout=1.0):
            recs.extend(got)
    mine = [r for r in recs if r.partition == part.index]
    headers = [decode_checkpoint_chunk(r.value)[0] for r in mine]
    assert {h.snapshot for h in headers} == {latest}
    assert sorted(h.chunk for h in headers) == list(range(headers[0].chunks)) and headers[0].chunks > 1
    assert all(r.partition == part.index for r in recs)  # the other partitions never had a checkpoint


def test_only_the_latest_checkpoint_stays_embedded(metrics: MetricSet, transport: Transport) -> None:
    only_latest_checkpoint(transport, metrics)


@pytest.mark.kafka
def test_only_the_latest_checkpoint_stays_kafka(metrics: MetricSet, kafka_bootstrap: str) -> None:
    with open_transport(f"kafka://{kafka_bootstrap}") as tr:
        only_latest_checkpoint(tr, metrics)


def test_the_embedded_log_overwrites_deleted_checkpoints(tmp_path: Path, metrics: MetricSet) -> None:
    """The bytes of a superseded checkpoint are gone from the SQLite file, not only unreachable."""
    path = tmp_path / "log.sqlite3"
    tp = Topics()
    with open_transport(f"sqlite:///{path}") as tr:
        uploads, state, _ = feed_and_tap(tr, tp, metrics)
    first = bytes(state[0].value)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    data = path.read_bytes() + (
        path.with_name(path.name + "-wal").read_bytes() if Path(f"{path}-wal").exists() else b""
    )
    # the first checkpoint's sealed payload (the tap kept it)
    assert first[-64:] not in data
    live = [bytes(r.value)[-64:] for r in state if (r.partition, r.offset) == (state[-1].partition, state[-1].offset)]
    assert live and live[0] in data  # the latest checkpoint is still there: the search does find what exists


# -- keys -------------------------------------------------------------------------------------------------


def test_only_the_current_checkpoint_format_is_read() -> None:
    """A chunk of format 1 (clear header and records, written by early shufflers) is not a checkpoint any more:
    the shuffler logs it as malformed and skips it."""
    header = b'{"group":"g","partition":0,"raw_offset":4,"snapshot":"0000000000000000","chunk":0,"chunks":1}'
    with pytest.raises(FramingError, match="version 1"):
        decode_checkpoint_chunk(pack_headed(b"LDPQ", header, b"\0" * 32, version=1))


def test_a_member_with_another_key_refuses_to_restore(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    tp = Topics()
    publish(transport, tp.raw, [olh_batch(metrics, 30)])
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100))
    sh.run(idle_exit=0.5)
    sh.close()
    other = Shuffler(transport, metrics, tp.settings(min_batch=100, key_file=str(tmp_path / "other.key")))
    with pytest.raises(ShufflerStateError, match="another shuffler key"):
        other.run(idle_exit=2.0)
    other.close()
    again = Shuffler(transport, metrics, tp.settings(min_batch=100))  # the right key: the 30 reports are there
    again.run(idle_exit=0.5)
    again.close()
    assert again.stats.buffered_reports == 30


def test_the_key_file_is_private(tmp_path: Path, metrics: MetricSet, transport: Transport) -> None:
    tp = Topics()
    key = tmp_path / "k" / "shuffler.key"
    Shuffler(transport, metrics, tp.settings(key_file=str(key)))
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by other users"):
        Shuffler(transport, metrics, tp.settings(key_file=str(key)))


def test_the_id_window_keeps_at_least_half_and_at_most_all() -> None:
    w = _IdWindow(10)
    ids = [bytes([i]) * 16 for i in range(40)]
    for i, d in enumerate(ids):
        w.add(d)
        assert len(w) <= 10
        assert all(x in w for x in ids[max(0, i - 4) : i + 1])  # the last 5 = ceil(10 / 2)
    digests, previous = w.serialized()
    assert digests[:previous] == sorted(digests[:previous]) and digests[previous:] == sorted(digests[previous:])
    assert ids[0] not in w


def test_released_envelopes_still_decode(metrics: MetricSet, transport: Transport) -> None:
    """The shuffled topic is unchanged by the new checkpoints (its readers are other services)."""
    tp = Topics()
    publish(transport, tp.raw, [olh_batch(metrics, 100)])
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100))
    sh.run(idle_exit=0.5)
    sh.close()
    specs = {m.spec.spec_id: m.spec for m in metrics.values()}
    with transport.consume(tp.shuffled, "r", session_timeout=10.0) as c:
        (rec,) = c.poll(max_records=10, timeout=5.0)
    assert decode_envelope(rec.value, specs).meta.n == 100
