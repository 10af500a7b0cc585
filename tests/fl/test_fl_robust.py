"""Robust aggregation wrappers against scaled and sign-flipped updates; input validation."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.fl.aggregators import REJECTION_REASONS, RoundContext, ValidatingAggregator, WeightedMean
from estimator.fl.robust import CoordinateMedian, Krum, TrimmedMean
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl import ClientUpdate, FLError, LocalTraining, LogisticRegression
from simulator.rounds import FederatedClient, run_rounds

D = 50
F = 3


def _round(attack: str, seed: int = 0, n: int = 12):
    """n − F honest updates N(μ, 0.1²·I) with ‖μ‖ = √D·0.5 ≈ 3.5, and F malicious ones."""
    rng = np.random.default_rng(seed)
    mu = np.full(D, 0.5)
    honest = [mu + 0.1 * rng.normal(size=D) for _ in range(n - F)]
    bad = [(-10.0 * mu if attack == "flip" else 100.0 * mu) + 0.1 * rng.normal(size=D) for _ in range(F)]
    ups = [ClientUpdate(f"c{i}", 0, v.astype(np.float32), 10) for i, v in enumerate(honest + bad)]
    return ups, mu, RoundContext(0, D, rng, float(n))


ROBUST = {
    "median": lambda: CoordinateMedian(WeightedMean(), f=F),
    "trimmed": lambda: TrimmedMean(WeightedMean(), f=F),
    "krum": lambda: Krum(WeightedMean(), f=F),
    "multikrum": lambda: Krum(WeightedMean(), f=F, multi=5),
}


@pytest.mark.parametrize("attack", ["flip", "scale"])
@pytest.mark.parametrize("name", sorted(ROBUST))
def test_robust_aggregators_resist_what_derails_fedavg(name: str, attack: str) -> None:
    """Honest noise per coordinate has sd 0.1, so any robust estimate of μ built from
    honest updates is within a few 0.1·√D ≈ 0.7 of μ; the bound 1.5 leaves room for
    the bias F/(n−F) quantile shifts give the median. FedAvg moves by
    F/n · (attack − μ), at least 0.25·11·3.5 ≈ 9.6."""
    ups, mu, ctx = _round(attack)
    robust = ROBUST[name]().aggregate(ups, ctx)
    plain = WeightedMean().aggregate(ups, ctx)
    assert np.linalg.norm(robust.delta - mu) < 1.5
    assert np.linalg.norm(plain.delta - mu) > 9.0
    if name.endswith("krum"):
        assert not {"c9", "c10", "c11"} & set(robust.info["selected"])


def test_training_with_sign_flipping_clients() -> None:
    """2 of 8 clients upload −5× their honest update every round: FedAvg's model is
    pushed the wrong way, trimmed mean and multi-Krum still learn."""
    rng = np.random.default_rng(3)
    w = np.array([1.0, -2.0, 0.5])

    def data(n):
        X = rng.normal(size=(n, 3)).astype(np.float32)
        return X, (X @ w > 0).astype(int)

    clients = [FederatedClient(f"c{i}", *data(60)) for i in range(8)]
    Xt, yt = data(1000)

    def tamper(r, ups):
        return [
            ClientUpdate(u.client_id, u.round, -5.0 * u.delta, u.num_examples) if u.client_id in ("c0", "c1") else u
            for u in ups
        ]

    model, tr = LogisticRegression(3), LocalTraining(epochs=1, batch_size=20, learning_rate=0.2)
    acc = {}
    for name, agg in [
        ("fedavg", WeightedMean()),
        ("trimmed", TrimmedMean(WeightedMean(), f=2)),
        ("multikrum", Krum(WeightedMean(), f=2, multi=4)),
    ]:
        _, hist = run_rounds(
            model,
            FedAvg(tr),
            agg,
            clients,
            FixedCountSampling(8),
            15,
            np.random.default_rng(0),
            test=(Xt, yt),
            tamper=tamper,
        )
        acc[name] = hist[-1].test_accuracy
    assert acc["fedavg"] < 0.5
    assert acc["trimmed"] > 0.9 and acc["multikrum"] > 0.9


def test_too_few_updates_for_f_refused() -> None:
    ups, _, ctx = _round("flip", n=8)
    with pytest.raises(FLError, match="at least 9"):
        Krum(WeightedMean(), f=3).aggregate(ups, ctx)
    with pytest.raises(FLError, match="at least 7"):
        CoordinateMedian(WeightedMean(), f=3).aggregate(ups[:6], ctx)
    with pytest.raises(FLError):
        TrimmedMean(WeightedMean(), f=-1)


def test_bad_uploads_are_rejected_and_counted() -> None:
    v = WeightedMean()
    agg = ValidatingAggregator(v)
    good = [ClientUpdate(f"g{i}", 1, np.full(4, float(i), np.float32), 1) for i in range(3)]
    nan = np.ones(4, np.float32)
    nan[2] = np.nan
    inf = np.ones(4, np.float32)
    inf[0] = -np.inf
    tampered = ClientUpdate("t", 1, np.ones(4, np.float32), 1)
    object.__setattr__(tampered, "delta", np.full(4, 9.0, np.float32))  # content changed after the id was computed
    bad = [
        ClientUpdate("s", 1, np.ones(5, np.float32), 1),  # wrong shape
        ClientUpdate("i", 1, np.ones(4, np.int32), 1),  # not floats
        ClientUpdate("n", 1, nan, 1),  # NaN
        ClientUpdate("f", 1, inf, 1),  # inf
        ClientUpdate("o", 0, np.ones(4, np.float32), 1),  # stale round
        good[0],  # replay within the round
        ClientUpdate("g1", 1, np.full(4, 7.0, np.float32), 1),  # second upload from g1
        ClientUpdate("w", 1, np.ones(4, np.float32), -3),  # negative weight
        tampered,
    ]
    res = agg.aggregate(good + bad, RoundContext(1, 4, np.random.default_rng(0), 3.0))
    assert res.num_clients == 3
    np.testing.assert_allclose(res.delta, np.full(4, 1.0))
    assert res.info["rejected"] == {
        "wrong_shape": 1,
        "wrong_dtype": 1,
        "non_finite": 2,
        "stale_round": 1,
        "replayed": 2,
        "duplicate_client": 1,
        "bad_weight": 1,
    }
    assert set(res.info["rejected"]) <= set(REJECTION_REASONS)
    # the same upload replayed in the next round is stale; replayed with its round forged, its id no longer matches
    ctx2 = RoundContext(2, 4, np.random.default_rng(0), 3.0)
    forged = ClientUpdate("g2", 2, good[2].delta, 1, upload_id=good[2].upload_id)
    res2 = agg.aggregate([good[2], forged], ctx2)
    assert res2.num_clients == 0 and res2.info["rejected"] == {"stale_round": 1, "replayed": 1}
    assert agg.rejected["replayed"] == 3 and sum(agg.rejected.values()) == 11


def test_replay_within_a_round_across_calls_is_refused() -> None:
    """A round may be aggregated from several batches; an upload seen in an earlier batch
    of the same round is a replay."""
    agg = ValidatingAggregator(WeightedMean())
    up = ClientUpdate("a", 5, np.ones(3, np.float32), 2)
    ctx = RoundContext(5, 3, np.random.default_rng(0), 1.0)
    assert agg.aggregate([up], ctx).num_clients == 1
    res = agg.aggregate([up], ctx)
    assert res.num_clients == 0 and res.info["rejected"] == {"replayed": 1}
