"""Central DP inside the Prio3 aggregators (docs/PRIO3.md, "Central noise"): each aggregator adds discrete
Laplace noise to its own aggregate share before releasing it, so the collector never holds the exact aggregate.

Played as the collector over HTTP: real devices (client_sdk.prio3) upload through the real collector, the
leader and the helper aggregate over HTTP, and the test asks both for their shares the way the combine step
does. Statistical checks use fixed seeds and a z of 5.33 (two-sided tail 1e-7 per check; fewer than ten
checks in this file, so a false alarm below 1e-6).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from client_sdk.prio3 import Prio3Client
from collector.aggregator.collect import unshard
from ldp_core.days import utc_day
from ldp_core.errors import SpecError
from ldp_core.prio3.noise import AggregatorNoise
from ldp_core.prio3.vdaf import Prio3, load_binding
from simulator.prio3.stack import Deployment, Prio3Stack, new_deployment

Z = 5.33  # two-sided normal tail 1e-7
WIDE = 1000
METRICS = {
    "n.count": {"type": "count"},
    "n.sum": {"type": "sum", "max_measurement": 50},
    "n.wide": {"type": "histogram", "length": WIDE},
}
EPS = 0.5
LEADER_SEED, HELPER_SEED = bytes(range(32)), bytes(range(100, 132))


def _pmf(b: float, half_width: int) -> tuple[np.ndarray, np.ndarray]:
    """Discrete Laplace of scale b on [-half_width, half_width]: P[k] = (1-r)/(1+r) r^|k|, r = e^{-1/b}."""
    r = math.exp(-1.0 / b)
    k = np.arange(-half_width, half_width + 1)
    return k, (1 - r) / (1 + r) * r ** np.abs(k)


def _moments(k: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(variance, fourth central moment) of a zero-mean pmf."""
    return float(np.sum(p * k**2)), float(np.sum(p * k**4))


def _check_mean_and_variance(x: np.ndarray, var: float, mu4: float) -> None:
    """Mean within Z sd of 0 (sd = sqrt(var/n)); sample variance within Z sd of var (sd = sqrt((mu4 - var²)/n))."""
    n = x.size
    assert abs(x.mean()) <= Z * math.sqrt(var / n), (x.mean(), var)
    s2 = float(np.mean(x.astype(np.float64) ** 2))
    assert abs(s2 - var) <= Z * math.sqrt((mu4 - var**2) / n), (s2, var)


def test_crate_sampler_is_discrete_laplace() -> None:
    """The binding's sampler (the crate's, seeded TurboSHAKE128) against the pmf: the frequency of each value in
    [-3, 3] within Z binomial sd of n·P[k] (7 checks), and the mean and the variance."""
    noise = AggregatorNoise(EPS, 1)  # scale 2
    b = float(noise.scale)
    n = 100_000
    x = np.asarray(noise.draw(n, bytes(32)))
    k, p = _pmf(b, 400)
    var, mu4 = _moments(k, p)
    assert math.isclose(var, noise.variance, rel_tol=1e-9)
    for value in range(-3, 4):
        pk = float(p[k == value][0])
        got = int(np.sum(x == value))
        assert abs(got - n * pk) <= Z * math.sqrt(n * pk * (1 - pk)), (value, got, n * pk)
    _check_mean_and_variance(x, var, mu4)
    # the seed is the only randomness: the same seed gives the same draws, another seed others
    assert noise.draw(50, bytes(32)) == [int(v) for v in x[:50]]
    assert noise.draw(50, bytes([1]) + bytes(31)) != [int(v) for v in x[:50]]


def test_noise_parameters_and_bad_input() -> None:
    assert AggregatorNoise.for_config(Prio3("sum", max_measurement=240), 1.0).sensitivity == 240
    assert AggregatorNoise.for_config(Prio3("sumvec", max_measurement=15, length=6), 1.0).sensitivity == 90
    assert AggregatorNoise.for_config(Prio3("histogram", length=8), 1.0).sensitivity == 1
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SpecError):
            AggregatorNoise(bad, 1)
    b = load_binding()
    vdaf = Prio3("count").vdaf()
    share = vdaf.aggregate([])
    with pytest.raises(ValueError, match="noise has 2 values"):
        vdaf.add_to_aggregate_share(share, [1, 2])
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        b.discrete_laplace(2, 1, 3, b"short")
    # without noise, the signed read of the sum of the shares is the crate's unshard
    hist = Prio3("histogram", length=4).vdaf()
    shares = [hist.aggregate([]), hist.aggregate([])]
    assert list(hist.unshard_signed(shares)) == [int(v) for v in hist.unshard(shares, 0)] == [0] * 4
    # -5 added in the field reads back as -5
    assert list(hist.unshard_signed([hist.add_to_aggregate_share(shares[0], [-5, 0, 3, 0]), shares[1]])) == [
        -5,
        0,
        3,
        0,
    ]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    return new_deployment(tmp_path_factory.mktemp("ops"), METRICS)


@pytest.fixture
def stack(deployment: Deployment, tmp_path: Path) -> Iterator[Prio3Stack]:
    seeds = (lambda: HELPER_SEED, lambda: LEADER_SEED)
    with Prio3Stack(deployment, tmp_path / "run", central_epsilon=EPS, noise_seeds=seeds) as st:
        yield st


def test_collector_never_sees_the_exact_aggregate(stack: Prio3Stack, tmp_path: Path) -> None:
    """Play the collector: ask both aggregators for their shares over HTTP and combine them. The result is the
    exact aggregate plus each aggregator's own noise (reproduced from its seed with the crate's sampler); the
    collector colluding with the leader (who knows its noise) still holds the helper's noise; and over the
    1,000 buckets of the wide histogram the collector's error has the mean and the variance of the sum of two
    independent discrete Laplace draws."""
    rng = np.random.default_rng(7)
    day = utc_day(time.time())
    truth: dict[str, list[int]] = {"n.count": [0], "n.sum": [0], "n.wide": [0] * WIDE}
    for i in range(6):
        dev = Prio3Client(stack.metrics, tmp_path / f"dev{i}", stack.collector_url)
        vals = {
            "n.count": int(rng.integers(0, 2)),
            "n.sum": int(rng.integers(0, 51)),
            "n.wide": int(rng.integers(0, WIDE)),
        }
        for name, v in vals.items():
            assert dev.record(name, v)
        truth["n.count"][0] += vals["n.count"]
        truth["n.sum"][0] += vals["n.sum"]
        truth["n.wide"][vals["n.wide"]] += 1
        assert dev.flush() == "idle"
        dev.close()
    stack.wait_settled(6 * 3)
    for name, want in truth.items():
        exact = stack.audit_exact(name, day)
        assert np.atleast_1d(exact.value).tolist() == want  # the aggregators' own shares sum to the truth
        shares = []
        for url in (stack.leader_url, stack.helper_url):
            resp = httpx.post(
                url + "/v1/prio3/collect",
                json={"metric": name, "day": day},
                headers={"authorization": f"Bearer {stack.token}"},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
            shares.append(resp.json())
            assert shares[-1]["noise"]["epsilon"] == EPS and shares[-1]["noise"]["mechanism"] == "discrete_laplace"
        view = np.atleast_1d(unshard(stack.metrics, name, day, shares).value).astype(np.int64)
        noise = AggregatorNoise.for_config(stack.metrics.prio3[name].config, EPS)
        lead = np.asarray(noise.draw(len(want), LEADER_SEED))
        helper = np.asarray(noise.draw(len(want), HELPER_SEED))
        assert view.tolist() == (np.asarray(want) + lead + helper).tolist(), name
        # the collector and the leader together: the helper's noise remains
        assert (view - lead - np.asarray(want)).tolist() == helper.tolist()
        if name == "n.wide":
            assert np.sum(view != np.asarray(want)) > WIDE // 2  # most buckets differ from the exact counts
            k, p1 = _pmf(float(noise.scale), 300)
            p2 = np.convolve(p1, p1)
            var, mu4 = _moments(np.arange(-600, 601), p2)
            assert math.isclose(var, 2 * noise.variance, rel_tol=1e-9)
            _check_mean_and_variance(view - np.asarray(want), var, mu4)
        else:
            assert view.tolist() != want or name == "n.count"  # scale 2 (count) may draw 0+0 by chance
