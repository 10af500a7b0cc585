"""The shuffler: crowd threshold, permutation uniformity, duplicate drops, checkpoints, exactly once across kill -9.

Reports are identified by their OLH seed (``tests.support.collector_support.olh_batch``),
so the shuffled output can be checked report by report against the input.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from collector.shuffler import Shuffler, ShufflerSettings
from collector.shuffler.groups import plan_release
from collector.shuffler.permute import csprng_permutation, fisher_yates
from estimator.accounting.shuffle import grid_floor, shuffler_guarantee
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import encode_frame
from pipeline.envelope import decode_envelope
from pipeline.topics import key_metric_day, metric_day_key, shuffled_key, spread_keys
from pipeline.transport import Transport, open_transport
from tests.support.collector_support import TODAY, olh_batch, write_metrics

ROOT = Path(__file__).resolve().parents[2]
#: a chi-square statistic above the (1 - 1e-6) quantile fails: a correct shuffle fails once in a million seeds
ALPHA = 1e-6


def seeded_words(seed: int):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return lambda k: rng.integers(0, 2**32, size=k, dtype=np.uint32)


def chi_square(counts: np.ndarray) -> float:
    expected = counts.sum() / counts.size
    return float(((counts - expected) ** 2 / expected).sum())


class Topics:
    """Fresh topic and group names for one test (the Kafka broker is shared)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.raw = f"t.raw-{tag}"
        self.shuffled = f"t.shuffled-{tag}"
        self.state = f"t.state-{tag}"
        self.group = f"shuffler-{tag}"
        #: the shuffler's secret, shared by every shuffler of the test (as by the members of a deployment)
        self.key_file = os.path.join(tempfile.gettempdir(), f"ldp-test-shuffler-{tag}.key")

    def settings(self, **kw: object) -> ShufflerSettings:
        base = dict(
            raw_topic=self.raw,
            shuffled_topic=self.shuffled,
            state_topic=self.state,
            group=self.group,
            partitions=4,
            checkpoint_interval=0.05,
            session_timeout=2.0,
            key_file=self.key_file,
        )
        base.update(kw)
        return ShufflerSettings(**base)  # type: ignore[arg-type]


def read_shuffled(
    transport: Transport,
    topic: str,
    metrics: MetricSet,
    *,
    expect: int | None = None,
    timeout: float = 60.0,
    quiet: float = 0.5,
) -> list:  # type: ignore[type-arg]
    """Every shuffled batch of ``topic``; with ``expect``, wait until that many reports came, then ``quiet`` s more."""
    specs = {m.spec.spec_id: m.spec for m in metrics.values()}
    out = []
    got = 0
    end = time.monotonic() + timeout
    with transport.consume(topic, f"reader-{uuid.uuid4().hex[:8]}", session_timeout=2.0) as c:
        last = time.monotonic()
        while True:
            recs = c.poll(max_records=1000, timeout=0.1)
            for r in recs:
                sb = decode_envelope(r.value, specs)
                out.append((r.key, sb))
                got += sb.meta.n
            if recs:
                last = time.monotonic()
            reached = expect is None or got >= expect
            if reached and time.monotonic() - last >= quiet:
                return out
            if time.monotonic() > end:
                pytest.fail(f"read {got} shuffled reports of {expect} within {timeout} s")


@pytest.fixture
def metrics(tmp_path: Path) -> MetricSet:
    return write_metrics(tmp_path / "metrics.json")


@pytest.fixture
def transport(tmp_path: Path) -> Iterator[Transport]:
    tr = open_transport(f"sqlite:///{tmp_path}/log.sqlite3")
    yield tr
    tr.close()


def publish(transport: Transport, topic: str, batches: list, partitions: int = 4) -> None:  # type: ignore[type-arg]
    try:
        transport.partitions(topic)
    except ValueError:
        transport.create_topic(topic, partitions)
    transport.publish_many(topic, [(metric_day_key(b.metric, b.day), encode_frame(b)) for b in batches])


# -- release planning and permutations ------------------------------------------------------------


def test_plan_release_respects_both_bounds() -> None:
    for min_batch, cap in [(1, 1), (100, 100), (100, 250), (100, 1000), (7, 20)]:
        for n in range(0, 3 * cap + 2 * min_batch):
            sizes = plan_release(n, min_batch, cap)
            assert sum(sizes) <= n
            assert all(min_batch <= s <= cap for s in sizes)
            if n >= min_batch:
                assert sizes, (n, min_batch, cap)
                # what is kept is less than a full batch, so a fuller release was impossible
                assert n - sum(sizes) < cap
            else:
                assert sizes == []


def test_permutation_is_uniform_over_all_orders() -> None:
    """All 24 orders of 4 items, T = 12,000 seeded draws: each order is expected T/24 = 500 times
    (binomial variance T p (1-p)); the chi-square statistic over the 24 cells follows chi2(23) under
    uniformity. The naive shuffle (swap i with j uniform in [0, n): 4^4 = 256 equally likely paths onto
    24 orders, so some orders have probability 8/256 and others 15/256) has expected statistic
    23 + T * sum((p - 1/24)^2 / (1/24)) = about 380 here, far above the limit of about 70.5: the test
    has the power to see such a slip, and checks that it does."""
    t = 12_000
    words = seeded_words(1)
    perms = [tuple(csprng_permutation(4, words)) for _ in range(t)]
    index = {p: i for i, p in enumerate(sorted(set(perms)))}
    assert len(index) == 24
    counts = np.bincount([index[p] for p in perms], minlength=24)
    limit = stats.chi2.ppf(1 - ALPHA, 23)
    assert chi_square(counts) < limit

    rng = np.random.default_rng(2)
    naive = Counter()
    for _ in range(t):
        p = list(range(4))
        for i in range(4):
            j = int(rng.integers(0, 4))
            p[i], p[j] = p[j], p[i]
        naive[tuple(p)] += 1
    assert chi_square(np.array([naive[p] for p in index])) > limit


def test_kernel_is_lemire_fisher_yates_and_reports_exhaustion() -> None:
    perm = np.arange(5, dtype=np.int64)
    assert fisher_yates(perm, np.zeros(2, dtype=np.uint32)) == -1  # 4 draws are needed
    perm = np.arange(1000, dtype=np.int64)
    used = fisher_yates(perm, seeded_words(3)(2000))
    assert 999 <= used <= 2000 and np.array_equal(np.sort(perm), np.arange(1000))
    real = [csprng_permutation(50) for _ in range(2)]  # the OS CSPRNG
    assert all(np.array_equal(np.sort(p), np.arange(50)) for p in real)
    assert not np.array_equal(real[0], real[1])  # equal with probability 1/50!


@pytest.mark.parametrize("name", ["rr", "grr", "oue", "olh", "rappor", "cms", "hcms", "hr"])
def test_byte_row_gather_equals_fancy_indexing(name: str) -> None:
    from collector.shuffler.groups import _gather
    from ldp_core.mechanisms import make_spec

    spec = make_spec(name, epsilon=1.0) if name == "rr" else make_spec(name, epsilon=1.0, domain_size=64)
    rng = np.random.default_rng(6)
    records = spec.encode(rng.integers(0, spec.domain_size, 300), rng)
    perm = csprng_permutation(300, seeded_words(7))
    got = _gather(records, perm)
    assert got.dtype == records.dtype and got.tobytes() == records[perm].tobytes()


# -- the shuffler in-process on the embedded log ----------------------------------------------------


def run_until_idle(shuffler: Shuffler, idle: float = 0.5) -> None:
    shuffler.run(idle_exit=idle)


def test_threshold_holds_back_small_groups_and_releases_crowds(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    tp = Topics()
    # group A: 99 reports in 3 uploads; group B: 250 reports; with min 100 and max 100, B releases 2 x 100
    a = [olh_batch(metrics, 33, first_seed=33 * i) for i in range(3)]
    b = [olh_batch(metrics, 125, first_seed=10_000 + 125 * i, day=TODAY - 1) for i in range(2)]
    publish(transport, tp.raw, a + b)
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100, max_batch=100))
    run_until_idle(sh)
    out = read_shuffled(transport, tp.shuffled, metrics)
    assert sorted(sb.meta.n for _, sb in out) == [100, 100]
    # keyed per released batch (issue 31): the metric-day's batches spread over the shuffled partitions
    assert {k for k, _ in out} == {
        shuffled_key("emoji_used", TODAY - 1, bytes.fromhex(sb.meta.shuffle_id)) for _, sb in out
    }
    assert {key_metric_day(k) for k, _ in out} == {("emoji_used", TODAY - 1)}
    assert sh.stats.buffered_reports == 99 + 50
    # one more report for A crosses the threshold: all 100 released together, after a restart from the checkpoint
    sh.close()
    publish(transport, tp.raw, [olh_batch(metrics, 1, first_seed=99)])
    sh2 = Shuffler(transport, metrics, tp.settings(min_batch=100, max_batch=100))
    run_until_idle(sh2)
    sh2.close()
    assert sh2.stats.restores >= 1
    out = read_shuffled(transport, tp.shuffled, metrics)
    released_a = [sb for k, sb in out if key_metric_day(k) == ("emoji_used", TODAY)]
    # sources is a lower bound: the 99 reports restored from the checkpoint count as one upload, plus the new one
    assert len(released_a) == 1 and released_a[0].meta.n == 100 and released_a[0].meta.sources == 2
    assert np.array_equal(np.sort(released_a[0].batch.records["seed"]), np.arange(100))


def test_duplicate_uploads_are_dropped_across_a_restart(
    tmp_path: Path, metrics: MetricSet, transport: Transport
) -> None:
    tp = Topics()
    first = [olh_batch(metrics, 10, first_seed=10 * i) for i in range(5)]
    publish(transport, tp.raw, first + first[:2])  # a collector retry that was published twice
    sh = Shuffler(transport, metrics, tp.settings(min_batch=100))
    run_until_idle(sh)
    sh.close()
    assert sh.stats.duplicate_batches == 2 and sh.stats.input_reports == 50
    second = [olh_batch(metrics, 10, first_seed=50 + 10 * i) for i in range(5)]
    publish(transport, tp.raw, first[2:4] + second)  # retries arriving after the restart
    sh2 = Shuffler(transport, metrics, tp.settings(min_batch=100))
    run_until_idle(sh2)
    sh2.close()
    assert sh2.stats.duplicate_batches == 2
    (batch,) = [sb for _, sb in read_shuffled(transport, tp.shuffled, metrics)]
    assert np.array_equal(np.sort(batch.batch.records["seed"]), np.arange(100))


def test_released_batches_carry_fresh_ids_and_the_central_guarantee(metrics: MetricSet, transport: Transport) -> None:
    tp = Topics()
    batches = [olh_batch(metrics, 100, first_seed=100 * i) for i in range(30)]
    publish(transport, tp.raw, batches)
    delta = 1e-6
    sh = Shuffler(transport, metrics, tp.settings(min_batch=1000, max_batch=1500), guarantee=shuffler_guarantee(delta))
    run_until_idle(sh)
    sh.close()
    out = [sb for _, sb in read_shuffled(transport, tp.shuffled, metrics)]
    assert sum(sb.meta.n for sb in out) == 3000
    from estimator.accounting.shuffle import shuffle_guarantee

    uploaded = {b.batch_id for b in batches}
    for sb in out:
        assert 1000 <= sb.meta.n <= 1500
        assert sb.meta.shuffle_id == sb.batch.batch_id.hex() and sb.batch.batch_id not in uploaded
        expected = shuffle_guarantee(1.0, grid_floor(sb.meta.n), delta)
        assert (sb.meta.central_epsilon, sb.meta.central_delta) == (expected.epsilon, delta)
        assert sb.meta.epsilon0 == 1.0 and sb.meta.central_epsilon < 1.0


def test_the_central_epsilon_is_per_person_not_per_report(tmp_path: Path, transport: Transport) -> None:
    """500 devices each upload their 2 reports of the day (max_reports_per_day = 2, ε₀ = 1) in one upload.

    A neighbouring dataset changes one *person*, i.e. both of that device's reports: the batch is a shuffle of
    at least ⌈1000 / 2⌉ = 500 randomizers, each 2·ε₀-LDP (basic composition). The figure attached must be the
    FMT21 bound for that crowd, which is larger than the per-report figure (1,000 randomizers of ε₀) that an
    analyzer would otherwise be shown."""
    metrics = write_metrics(tmp_path / "m2.json", emoji_reports_per_day=2)
    tp = Topics()
    batches = [olh_batch(metrics, 2, first_seed=2 * i) for i in range(500)]
    publish(transport, tp.raw, batches, partitions=1)
    delta = 1e-6
    sh = Shuffler(
        transport,
        metrics,
        tp.settings(min_batch=1000, max_batch=1000, partitions=1),
        guarantee=shuffler_guarantee(delta),
    )
    run_until_idle(sh)
    sh.close()
    (sb,) = [sb for _, sb in read_shuffled(transport, tp.shuffled, metrics)]
    from estimator.accounting.shuffle import shuffle_guarantee

    per_person = shuffle_guarantee(2.0, grid_floor(500), delta).epsilon
    per_report = shuffle_guarantee(1.0, grid_floor(1000), delta).epsilon
    assert sb.meta.n == 1000 and sb.meta.epsilon0 == 1.0
    assert sb.meta.central_epsilon == per_person
    assert per_person > 2 * per_report  # what the per-report figure understated
    assert sb.meta.bound is not None and "500 people of up to 2 report(s)" in sb.meta.bound


def test_no_central_figure_without_the_metrics_reports_per_day(metrics: MetricSet, transport: Transport) -> None:
    """A shuffler given bare specs (no metrics file) cannot bound the reports per person: it attaches no central
    figure rather than a per-report one."""
    tp = Topics()
    publish(transport, tp.raw, [olh_batch(metrics, 1000)])
    specs = {m.spec.spec_id: m.spec for m in metrics.values()}
    sh = Shuffler(transport, specs, tp.settings(min_batch=1000), guarantee=shuffler_guarantee(1e-6))
    run_until_idle(sh)
    sh.close()
    out = [sb for _, sb in read_shuffled(transport, tp.shuffled, metrics)]
    assert out and all(sb.meta.central_epsilon is None and sb.meta.bound is None for sb in out)


def test_grid_floor_is_below_and_within_an_eighth() -> None:
    for n in list(range(1, 5000)) + [65_535, 65_536, 10**6 + 7]:
        g = grid_floor(n)
        assert g <= n and g > n * 8 / 9 - 1e-9 if n >= 16 else g == n


def test_shuffling_destroys_arrival_order(metrics: MetricSet, transport: Transport) -> None:
    """T = 800 groups, each of 8 single-report uploads released as one batch. Under a uniform permutation
    the output position of the first-arriving report is uniform on 0..7: counts have expectation T/8 = 100
    and the chi-square statistic over the 8 positions follows chi2(7) (limit about 40 at 1e-6); likewise
    for the last-arriving report. Without a shuffle the statistic would be 7 T = 5,600; a Sattolo slip
    (j < i, never a fixed point) gives about 100 + 7 * (800/56)^2 / 100 = 114."""
    tp = Topics()
    t, n = 800, 8
    spec = metrics["emoji_used"].spec
    uploads = []
    for g in range(t):
        for i in range(n):
            b = olh_batch(metrics, 1, first_seed=g * n + i)
            uploads.append(type(b)(f"m{g}", spec, TODAY, b.records, b.batch_id))
    publish(transport, tp.raw, uploads)
    sh = Shuffler(
        transport, {spec.spec_id: spec}, tp.settings(min_batch=n, max_batch=n, poll_records=2000), words=seeded_words(4)
    )
    run_until_idle(sh)
    sh.close()
    positions = {0: np.zeros(n, dtype=np.int64), n - 1: np.zeros(n, dtype=np.int64)}
    released = 0
    for _, sb in read_shuffled(transport, tp.shuffled, MetricSet({"emoji_used": metrics["emoji_used"]}), expect=t * n):
        seeds = sb.batch.records["seed"].astype(np.int64)
        g = int(sb.batch.metric[1:])
        rank = seeds - g * n
        assert sorted(rank.tolist()) == list(range(n))
        for r, counts in positions.items():
            counts[int(np.flatnonzero(rank == r)[0])] += 1
        released += 1
    assert released == t
    limit = stats.chi2.ppf(1 - ALPHA, n - 1)
    for counts in positions.values():
        assert chi_square(counts) < limit, counts


def test_collector_package_does_not_import_the_estimator() -> None:
    code = (
        "import sys, collector.http.app, collector.shuffler, collector.ingest; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('estimator', 'simulator')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_exactly_once_while_the_group_rebalances(tmp_path: Path, metrics: MetricSet) -> None:
    """Two shufflers in one group on the embedded log: B joins while A works (the partitions are split and
    every member restarts from the committed offsets), then A leaves (B restores A's partitions from their
    checkpoints). Uploads keep arriving throughout; at the end every report was released exactly once."""
    from pipeline.transport import partition_for

    tp = Topics()
    url = f"sqlite:///{tmp_path}/log.sqlite3"
    days = []
    for d in range(TODAY, TODAY - 60, -1):  # two metric-days on even partitions (member a), two on odd (b)
        parity = partition_for(metric_day_key("emoji_used", d), 4) % 2
        if sum(1 for x in days if partition_for(metric_day_key("emoji_used", x), 4) % 2 == parity) < 2:
            days.append(d)
        if len(days) == 4:
            break
    uploads = [olh_batch(metrics, 50, first_seed=50 * i, day=days[i % 4]) for i in range(160)]
    settings = {m: tp.settings(min_batch=100, max_batch=400, member=m, max_day_age=60) for m in "ab"}
    shufflers: dict[str, Shuffler] = {}
    stops = {m: threading.Event() for m in "ab"}
    errors: list[BaseException] = []

    def work(member: str) -> None:
        try:
            with open_transport(url) as tr:
                sh = shufflers[member] = Shuffler(tr, metrics, settings[member])
                sh.run(stops[member])
                sh.close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    def feed(tr: Transport, lo: int, hi: int) -> None:
        for i in range(lo, hi, 8):
            publish(tr, tp.raw, uploads[i : i + 8] + uploads[i : i + 1])  # one upload of each eight twice
            time.sleep(0.05)

    def wait_released(member: str) -> None:
        end = time.monotonic() + 60
        while member not in shufflers or shufflers[member].stats.released_reports == 0:
            assert time.monotonic() < end and not errors, (member, errors)
            time.sleep(0.05)

    with open_transport(url) as tr:
        tr.create_topic(tp.raw, 4)
        threads = {m: threading.Thread(target=work, args=(m,)) for m in "ab"}
        threads["a"].start()
        feed(tr, 0, 48)
        wait_released("a")
        threads["b"].start()  # the group rebalances: a keeps the even partitions, b takes the odd ones
        feed(tr, 48, 104)
        wait_released("b")
        stops["a"].set()  # a leaves: b restores a's partitions from their checkpoints
        threads["a"].join(60)
        feed(tr, 104, 160)
        out = read_shuffled(tr, tp.shuffled, metrics, expect=50 * 160, timeout=120, quiet=1.0)
        stops["b"].set()
        threads["b"].join(60)
    assert not errors, errors
    seeds = np.sort(np.concatenate([sb.batch.records["seed"] for _, sb in out]).astype(np.int64))
    assert np.array_equal(seeds, np.arange(50 * 160))
    assert shufflers["a"].stats.released_reports > 0 and shufflers["b"].stats.released_reports > 0
    assert shufflers["b"].stats.restores >= 1


# -- exactly once across kill -9, as the `ldp shuffler` process ------------------------------------------


class ShufflerProcess:
    def __init__(self, url: str, tp: Topics, metrics_path: Path, cwd: Path) -> None:
        args = [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "shuffler",
            "--transport",
            url,
            "--metrics",
            str(metrics_path),
            "--min-batch",
            "100",
            "--max-batch",
            "400",
            "--checkpoint-interval",
            "0.1",
            "--group",
            tp.group,
            "--member",
            "crash-test",
            "--partitions",
            "4",
            "--session-timeout",
            "2",
            "--raw-topic",
            tp.raw,
            "--shuffled-topic",
            tp.shuffled,
            "--state-topic",
            tp.state,
            "--no-guarantee",
        ]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "running as" not in line:
            self.proc.kill()
            raise AssertionError(f"shuffler did not start: {line!r} {self.proc.communicate()[1]}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)

    def stop(self) -> dict[str, int]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])["shuffler"]


def crash_scenario(url: str, tmp_path: Path, metrics: MetricSet) -> None:
    """120 uploads of 50 reports over three metric-days (plus 12 re-published duplicates) arrive while the
    shuffler runs; it is killed with SIGKILL once output appears, restarted, and at the end every report
    has been released exactly once (each group gets an even number of uploads, so nothing stays below 100)."""
    tp = Topics()
    days = [TODAY, TODAY - 1, TODAY - 2]
    uploads = [olh_batch(metrics, 50, first_seed=50 * i, day=days[i % 3]) for i in range(120)]
    schedule = []
    for i in range(0, 120, 10):
        chunk = uploads[i : i + 10]
        schedule.append(chunk + chunk[:1])  # each tenth upload is published twice
    expected = np.arange(50 * 120)
    procs: list[ShufflerProcess] = []
    with open_transport(url) as tr:
        tr.create_topic(tp.raw, 4)
        try:
            procs.append(ShufflerProcess(url, tp, tmp_path / "metrics.json", tmp_path))

            def feed() -> None:
                for chunk in schedule:
                    publish(tr, tp.raw, chunk)
                    time.sleep(0.15)

            feeder = threading.Thread(target=feed)
            feeder.start()
            try:
                read_shuffled(tr, tp.shuffled, metrics, expect=1, timeout=120, quiet=0.0)
                procs[0].kill9()
                procs.append(ShufflerProcess(url, tp, tmp_path / "metrics.json", tmp_path))
            finally:
                feeder.join()
            out = read_shuffled(tr, tp.shuffled, metrics, expect=expected.size, timeout=120, quiet=1.0)
            final = procs[1].stop()
        finally:
            for p in procs:
                if p.proc.poll() is None:
                    p.proc.kill()
                    p.proc.communicate()
    seeds = np.sort(np.concatenate([sb.batch.records["seed"] for _, sb in out]).astype(np.int64))
    assert np.array_equal(seeds, expected)  # every report once: none lost, none twice
    assert all(100 <= sb.meta.n <= 400 for _, sb in out)
    assert final["restores"] >= 1 and final["buffered_reports"] == 0


def test_exactly_once_across_kill9_embedded(tmp_path: Path, metrics: MetricSet) -> None:
    crash_scenario(f"sqlite:///{tmp_path}/log.sqlite3", tmp_path, metrics)


@pytest.mark.kafka
def test_exactly_once_across_kill9_kafka(tmp_path: Path, metrics: MetricSet, kafka_bootstrap: str) -> None:
    crash_scenario(f"kafka://{kafka_bootstrap}", tmp_path, metrics)


# -- the keys of released batches (issue 31) -------------------------------------------------------------------


def _sealed_metrics(tmp_path: Path) -> tuple[MetricSet, object]:
    from ldp_core.metrics import parse_metrics
    from ldp_core.wire.sealing import new_key_file

    _, key = new_key_file(tmp_path / "analyzer-keys")
    doc = {
        "format": "ldp-metrics/1",
        "analyzer_keys": [key.public.to_dict()],
        "metrics": {
            "word": {
                "owner": "o@example.org",
                "expires": "2099-12-31",
                "max_reports_per_day": 1,
                "description": "word, sealed",
                "mechanism": {"mechanism": "olh", "epsilon": 1.5},
                "domain": {"kind": "hashed", "size": 256, "seed": 4},
                "sealed": True,
            },
            "tab": {
                "owner": "o@example.org",
                "expires": "2099-12-31",
                "max_reports_per_day": 1,
                "description": "tab, plain",
                "mechanism": {"mechanism": "olh", "epsilon": 1.0},
                "domain": {"kind": "hashed", "size": 64, "seed": 1},
            },
        },
    }
    return parse_metrics(doc), key


@pytest.mark.parametrize(("keying", "spread"), [("batch", 0), ("batch", 2), ("metric-day", 0)])
def test_released_batches_spread_a_plain_metric_day_and_route_a_sealed_one_by_encapsulated_key(
    tmp_path: Path, transport: Transport, keying: str, spread: int
) -> None:
    """Keyed per batch (the default), one plain metric-day's released batches land in several shuffled
    partitions (with ``shuffled_spread`` 2, in exactly two, half the topic apart, taken in turn); a sealed
    metric-day's released batches are split into parts by their records' encapsulated keys, each part under the
    metric-day's sub-key its records route to (so a replay reaches its original's partition), every part
    carrying its release's id, size and central figure; ``shuffled_key="metric-day"`` keeps every metric-day in
    one partition, sealed batches whole."""
    from ldp_core.wire.frames import ReportBatch
    from ldp_core.wire.sealing import seal_batch
    from pipeline.topics import sealed_route
    from pipeline.transport import partition_for

    metrics, key = _sealed_metrics(tmp_path)
    rng = np.random.default_rng(5)
    plain_spec, word_spec = metrics["tab"].spec, metrics["word"].spec
    batches = []
    for _ in range(12):
        values = rng.integers(0, 64, 50)
        batches.append(ReportBatch("tab", plain_spec, TODAY, plain_spec.encode(values, rng), rng.bytes(16)))
        words = ReportBatch("word", word_spec, TODAY, word_spec.encode(rng.integers(0, 256, 50), rng), rng.bytes(16))
        batches.append(seal_batch(words, key.public))  # type: ignore[attr-defined]
    sent_words = {bytes(r) for b in batches if b.metric == "word" for r in b.records.view(np.uint8).reshape(len(b), -1)}
    tp = Topics()
    publish(transport, tp.raw, batches)
    settings = tp.settings(min_batch=50, max_batch=50, shuffled_key=keying, shuffled_spread=spread)
    sh = Shuffler(transport, metrics, settings, guarantee=lambda n, e0: (e0 / max(1.0, n**0.5), 1e-6, "test"))
    run_until_idle(sh)
    sh.close()
    out = read_shuffled(transport, tp.shuffled, metrics, expect=2 * 12 * 50)
    parts: dict[str, set[int]] = {"tab": set(), "word": set()}
    tab_keys: list[bytes] = []
    releases: dict[str, list] = {}
    got_words: list[bytes] = []
    width = word_spec.record_size + 52
    for k, sb in out:
        metric = sb.batch.metric
        assert key_metric_day(k) == (metric, TODAY)
        if keying == "batch" and metric == "word":  # routed by each record's encapsulated key
            subkeys = spread_keys(metric, TODAY, spread or 4, 4)
            assert sb.meta.parts == len(subkeys) and k == subkeys[sb.meta.part]
            assert set(sealed_route(sb.batch.records, width, len(subkeys)).tolist()) == {sb.meta.part}
            assert sb.meta.shuffle_id == sb.batch.batch_id.hex() != sb.meta.release_id
            releases.setdefault(sb.meta.release_id, []).append(sb.meta)
        elif keying == "batch" and metric == "tab" and spread:
            assert k in spread_keys(metric, TODAY, spread, 4)
        else:
            per_batch = keying == "batch" and metric == "tab"
            assert k == shuffled_key(metric, TODAY, bytes.fromhex(sb.meta.shuffle_id) if per_batch else None)
            assert sb.meta.release_id is None and sb.meta.parts is None
        if metric == "word":
            got_words.extend(bytes(r) for r in sb.batch.records.view(np.uint8).reshape(len(sb.batch), -1))
        parts[metric].add(partition_for(k, 4))
        tab_keys.extend([k] if metric == "tab" else [])
    assert sum(sb.meta.n for k, sb in out if sb.batch.metric == "tab") == 12 * 50
    assert sorted(got_words) == sorted(sent_words)  # every sealed record once, unaltered
    if keying == "batch":
        # 12 releases of 50 (min_batch applies to the release, before the split); each part carries the release's
        # size and central figure, and its parts add up to it
        assert len(releases) == 12
        for metas in releases.values():
            assert sum(m.n for m in metas) == metas[0].release_n == 50
            assert {(m.central_epsilon, m.central_delta) for m in metas} == {(1.5 / 50**0.5, 1e-6)}
        # 600 records over 4 (or 2) sub-keys by a uniform hash: a part left empty has probability <= 4 * (3/4)**600
        assert len(parts["word"]) == (spread or 4)
    else:
        assert len(parts["word"]) == 1
    # 12 random keys over 4 partitions all in one: probability 4 * 4**-12 = 2.4e-7
    if keying == "metric-day":
        assert len(parts["tab"]) == 1
    elif spread == 2:  # two partitions half the topic apart, one batch each in turn (12 batches: 6 and 6)
        assert len(parts["tab"]) == 2 and abs(max(parts["tab"]) - min(parts["tab"])) == 2
        assert sorted(Counter(tab_keys).values()) == [6, 6]
    else:
        assert len(parts["tab"]) > 1
