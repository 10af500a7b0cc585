"""The DP-FTRL aggregator (estimator/fl/ftrl.py DPFTRL) and its task option ``dp_ftrl``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.fl.aggregator_specs import DPFTRLSpec, aggregator_spec
from estimator.fl.aggregators import RoundContext, ValidatingAggregator, WeightedMean
from estimator.fl.dp import epsilon_by_adversary
from estimator.fl.ftrl import DPFTRL, FtrlAccountant, ftrl_epsilon, tree_depth
from estimator.fl.robust import CoordinateMedian
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import ClientUpdate
from tests.support.fl_pipeline_support import task_spec

DIM = 6


def _updates(r: int, rng: np.random.Generator, ids: list[str]) -> list[ClientUpdate]:
    return [ClientUpdate(c, r, rng.normal(0, 1, DIM).astype(np.float32), 10) for c in ids]


def _clip(v: np.ndarray, c: float) -> np.ndarray:
    v = np.asarray(v, np.float64)
    return v * min(1.0, c / float(np.linalg.norm(v)))


def test_the_released_model_is_the_ftrl_iterate_of_the_tree_noised_prefix_sum() -> None:
    agg = DPFTRL(WeightedMean(), clip_norm=0.5, noise_multiplier=1.2, restart_every=None)
    data_rng, noise_rng = np.random.default_rng(1), np.random.default_rng(2)
    released = np.zeros(DIM)
    clipped_sum = np.zeros(DIM)
    for r in range(11):
        ids = [f"c{r}-{i}" for i in range(4)]  # fresh clients each round: nothing is dropped
        ups = _updates(r, data_rng, ids)
        res = agg.aggregate(ups, RoundContext(r, DIM, noise_rng, 4.0))
        released += res.delta * 4.0
        clipped_sum += sum(_clip(u.delta, 0.5) for u in ups)
        assert agg.tree is not None
        # w_t − w_0 = η (Σ_{s≤t} clipped sums + n_t) / m̄ with n_t the tree's prefix noise
        np.testing.assert_allclose(released, clipped_sum + agg.tree.prefix(), rtol=0, atol=1e-12)
        assert res.info["tree_nodes"] == bin(r + 1).count("1") and res.info["repeated"] == 0


def test_a_client_contributes_once_per_tree_even_when_sampled_again() -> None:
    """The attack: a client (or a server colluding with it) gets it into every round of a tree, so its
    data would enter several leaves and the per-tree sensitivity C√levels would not hold. The wrapper
    drops its second update within a tree; after a restart it counts again. Without noise in the
    comparison (the same generator state) the released sum carries its update exactly once."""
    acc = FtrlAccountant(restart_every=3, delta=1e-5)
    agg = DPFTRL(WeightedMean(), clip_norm=1.0, noise_multiplier=1.0, restart_every=3, accountant=acc)
    data_rng = np.random.default_rng(3)
    repeated = []
    for r in range(6):
        ups = _updates(r, data_rng, ["attacker", f"other-{r}"])
        tree = agg.tree
        before = np.zeros(DIM) if tree is None or tree.restart_due else tree.prefix()
        res = agg.aggregate(ups, RoundContext(r, DIM, np.random.default_rng(100 + r), 2.0))
        repeated.append(res.info["repeated"])
        assert agg.tree is not None and agg.tree.step == r % 3 + 1
        kept = [u for u in ups if u.client_id != "attacker" or r % 3 == 0]  # first round of each tree only
        np.testing.assert_allclose(
            res.delta * 2.0, sum(_clip(u.delta, 1.0) for u in kept) + agg.tree.prefix() - before, rtol=0, atol=1e-12
        )
    assert repeated == [0, 1, 1, 0, 1, 1]
    assert acc.rounds == 6 and acc.epsilon() == ftrl_epsilon(1.0, 6, 1e-5, 3)


def test_state_survives_a_json_round_trip_mid_tree() -> None:
    import json

    a = DPFTRL(WeightedMean(), 0.5, 1.0, restart_every=4)
    b = DPFTRL(WeightedMean(), 0.5, 1.0, restart_every=4)
    data_rng, rng = np.random.default_rng(4), np.random.default_rng(5)
    for r in range(6):
        a.aggregate(_updates(r, data_rng, ["x", "y"]), RoundContext(r, DIM, rng, 2.0))
    b.load_state(json.loads(json.dumps(a.state())))
    assert b.contributed == a.contributed == {"x", "y"}
    rng_b = np.random.default_rng(0)
    rng_b.bit_generator.state = rng.bit_generator.state
    for r in range(6, 12):
        ups = _updates(r, data_rng, ["x", f"z{r}"])
        ra = a.aggregate(ups, RoundContext(r, DIM, rng, 2.0))
        rb = b.aggregate(ups, RoundContext(r, DIM, rng_b, 2.0))
        assert np.array_equal(ra.delta, rb.delta) and ra.info == rb.info
    with pytest.raises(FLError, match="another noise"):
        DPFTRL(WeightedMean(), 0.5, 2.0, restart_every=4).load_state(a.state())


def test_epsilon_is_the_same_for_observers_and_whoever_knows_the_sample() -> None:
    acc = FtrlAccountant(restart_every=2, delta=1e-5)
    for _ in range(20):
        acc.record(1.5)
    rows = {r["adversary"]: r for r in epsilon_by_adversary(acc, secagg=False)}
    assert rows["observer"]["epsilon"] == rows["knows_sample"]["epsilon"] == ftrl_epsilon(1.5, 20, 1e-5, 2)
    assert rows["observer"]["amplification"] is False
    assert rows["server_operator"]["epsilon"] is None  # central noise: the server saw the clipped updates


def test_task_option_round_trips_and_builds_the_ftrl_stack() -> None:
    spec = task_spec("ftrl", 8, aggregator={"kind": "dp_ftrl", "restart_every": 2})
    assert spec.aggregator == DPFTRLSpec(restart_every=2)
    assert spec.to_dict()["aggregator"] == {"kind": "dp_ftrl", "restart_every": 2, "efficient": False}
    acc = spec.build_accountant()
    assert isinstance(acc, FtrlAccountant) and acc.restart_every == 2
    agg = spec.build_aggregator(acc)
    assert isinstance(agg, ValidatingAggregator) and isinstance(agg.inner, DPFTRL)
    assert spec.device_clip_norm == spec.clip_norm
    assert aggregator_spec({"kind": "dp_ftrl"}) == DPFTRLSpec(None)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier > 0"),
        ({"secagg": True, "noise": {"kind": "distributed_discrete_gaussian", "bits": 16}}, "tree"),
        ({"algorithm": "scaffold"}, "scaffold"),
        ({"aggregator": {"kind": "dp_ftrl", "restart_every": 0}}, "restart_every"),
        ({"aggregator": {"kind": "dp_ftrl", "restarts": 2}}, "no options"),
        ({"aggregator": {"kind": "dp_ftrl", "efficient": "yes"}}, "efficient"),
    ],
)
def test_task_option_refuses_what_cannot_work(kw: dict, message: str) -> None:
    kw.setdefault("aggregator", {"kind": "dp_ftrl"})
    with pytest.raises(FLError, match=message):
        task_spec("ftrl-bad", 8, **kw)


def test_wrapper_refuses_a_non_linear_inner_and_no_noise() -> None:
    with pytest.raises(FLError, match="linear"):
        DPFTRL(CoordinateMedian(WeightedMean(), 1), 1.0, 1.0)
    with pytest.raises(FLError, match="noise_multiplier"):
        DPFTRL(WeightedMean(), 1.0, 0.0)


def test_with_secagg_the_task_builds_the_tree_over_the_decoded_sensitivity() -> None:
    """secagg is accepted now; the node noise is z·(C + slack), slack = C·2⁻²³ + √d/s for the population's
    quantizer scale s (Quantizer.for_clients(8, C)), and ε per adversary is DP-FTRL's, none for the operator."""
    from estimator.fl.aggregator_specs import secagg_quantization_slack
    from ldp_core.fl.secagg import Quantizer

    spec = task_spec("ftrl-sa", 8, secagg=True, aggregator={"kind": "dp_ftrl", "restart_every": 2})
    slack = secagg_quantization_slack(spec)
    assert slack == 0.5 * 2.0**-23 + math.sqrt(5) / Quantizer.for_clients(8, 0.5).scale
    agg = spec.build_aggregator(spec.build_accountant())
    assert isinstance(agg, ValidatingAggregator) and isinstance(agg.inner, DPFTRL)
    assert agg.inner.quantization_slack == slack and agg.inner.noise_stddev == 0.8 * (0.5 + slack)
    plain = task_spec("ftrl", 8, aggregator={"kind": "dp_ftrl", "restart_every": 2}).build_aggregator(None)
    assert plain.inner.quantization_slack == 0.0  # type: ignore[attr-defined]
    acc = FtrlAccountant(restart_every=2, delta=1e-5)
    for _ in range(6):
        acc.record(0.8)
    rows = {r["adversary"]: r for r in epsilon_by_adversary(acc, secagg=True)}
    assert rows["observer"]["epsilon"] == rows["knows_sample"]["epsilon"] == ftrl_epsilon(0.8, 6, 1e-5, 2)
    assert rows["server_operator"]["epsilon"] is None and "un-noised sum" in rows["server_operator"]["sees"]


def test_release_sum_is_the_aggregate_of_presummed_updates_and_refuses_a_repeat() -> None:
    """release_sum(Σ clip(Δ)) gives the same model step and tree as aggregate(updates) on the same
    generator state; eligible() leaves out the current tree's contributors until the tree restarts, and a
    contributor given twice within one tree is refused (the accounting allows one update per tree)."""
    data_rng = np.random.default_rng(3)
    a, b = DPFTRL(WeightedMean(), 0.5, 1.0, restart_every=2), DPFTRL(WeightedMean(), 0.5, 1.0, restart_every=2)
    rng_a, rng_b = np.random.default_rng(9), np.random.default_rng(9)
    for r, ids in enumerate([["x", "y"], ["z"], ["x", "z"]]):
        ups = _updates(r, data_rng, ids)
        total = sum(_clip(u.delta, 0.5) for u in ups)
        assert b.eligible(["x", "y", "z"]) == (["x", "y", "z"] if r != 1 else ["z"])
        ra = a.aggregate(ups, RoundContext(r, DIM, rng_a, 2.0))
        rb = b.release_sum(total, ids, RoundContext(r, DIM, rng_b, 2.0))
        assert np.allclose(ra.delta, rb.delta, rtol=0, atol=1e-12)
        assert rb.num_clients == len(ids) and rb.info["tree_step"] == ra.info["tree_step"]
    with pytest.raises(FLError, match="twice"):
        b.release_sum(np.zeros(DIM), ["x"], RoundContext(3, DIM, rng_b, 2.0))


def test_a_decoded_secagg_contribution_stays_within_c_plus_slack_and_can_exceed_c() -> None:
    """The sensitivity the SecAgg tree noise is calibrated to, played by the worst device input we can
    find: 4,000 float32 updates clipped to C (half of them on a coordinate axis, where the float32 cast
    and the rounding both act on one coordinate), quantized for the population's cohort and decoded
    alone. Every decoded norm is below C + slack; some are above C + √d/s, so without the slack (or with
    the rounding's term only) the node noise would be below z times the true sensitivity."""
    from estimator.fl.aggregator_specs import secagg_quantization_slack
    from ldp_core.fl.secagg import Quantizer

    spec = task_spec("ftrl-sa", 8, secagg=True, aggregator={"kind": "dp_ftrl"})
    c, d, slack = 0.5, 5, secagg_quantization_slack(spec)
    q = Quantizer.for_clients(len(spec.clients), c)
    rng = np.random.default_rng(17)
    excess = []
    for i in range(4000):
        v = rng.normal(size=d) if i % 2 else np.eye(d)[i % d] * rng.uniform(1, 10)
        clipped = np.asarray(_clip(v, c), np.float32)  # what the device uploads
        decoded = q.decode_sum(q.quantize(clipped, rng))
        excess.append(float(np.linalg.norm(decoded)) - c)
    assert max(excess) <= slack
    # above C, and above the rounding's √d/s alone: the float32 cast's term is needed too
    assert max(excess) > math.sqrt(d) / q.scale > 0


def test_audit_the_secagg_release_path_on_neighbouring_cohorts() -> None:
    """Empirical privacy audit of what a dp_ftrl + SecAgg task releases, on the code the job runs after
    unmasking: the devices' float32 clipped updates quantized (Quantizer.for_clients), the ring sum
    decoded (the masks cancel exactly: tests/fl/test_fl_secagg.py), then ``release_sum`` over a tree of
    2 rounds. World 1: client u adds an update of norm C in round 0; world 0: it does not (add/remove).
    The adversary sees both released prefixes; its best test projects P1 + P2 on u's direction: a shift
    of 2C at noise √2·zC, μ = √depth(2)/z. μ̂ must match it within 5 standard errors (√(2/n)), and the
    likelihood ratio of the event T > τ, with Clopper–Pearson 99.9 % bounds, stays below e^ε(δ) + δ
    at every τ of a grid (ε = ftrl_epsilon, the figure the job prints)."""
    from scipy import stats as sps

    from ldp_core.fl.secagg import Quantizer

    z, c, trials, delta = 1.5, 0.5, 5000, 1e-5
    q = Quantizer.for_clients(3, c)
    rng = np.random.default_rng(2027)
    v = np.asarray(_clip(np.arange(1.0, DIM + 1), c), np.float32)
    others = [np.asarray(_clip(rng.normal(size=DIM), c), np.float32) for _ in range(2)]
    direction = v.astype(np.float64) / float(np.linalg.norm(v))
    t = {0: np.empty(trials), 1: np.empty(trials)}
    for world in (0, 1):
        for k in range(trials):
            agg = DPFTRL(WeightedMean(), c, z, restart_every=2)
            ctx = RoundContext(0, DIM, rng, 2.0)
            cohort = others + ([v] if world else [])
            total0 = q.decode_sum(sum(q.quantize(x, rng) for x in cohort).astype(np.uint32))
            o0 = agg.release_sum(total0, [f"c{i}" for i in range(len(cohort))], ctx).delta
            total1 = q.decode_sum(q.quantize(others[0], rng))
            o1 = agg.release_sum(total1, ["d0"], RoundContext(1, DIM, rng, 2.0)).delta
            p1, p2 = o0 * 2.0, (o0 + o1) * 2.0
            t[world][k] = float((p1 + p2) @ direction)
    sd = math.sqrt((t[0].var(ddof=1) + t[1].var(ddof=1)) / 2)
    mu_hat = (t[1].mean() - t[0].mean()) / sd
    assert abs(mu_hat - math.sqrt(tree_depth(2)) / z) < 5 * math.sqrt(2 / trials)
    eps = ftrl_epsilon(z, 2, delta)
    for tau in np.quantile(t[0], np.linspace(0.05, 0.999, 30)):
        k1, k0 = int((t[1] > tau).sum()), int((t[0] > tau).sum())
        lo1 = sps.beta.ppf(0.0005, k1, trials - k1 + 1) if k1 else 0.0
        hi0 = sps.beta.ppf(0.9995, k0 + 1, trials - k0) if k0 < trials else 1.0
        assert lo1 <= math.exp(eps) * hi0 + delta, (tau, lo1, hi0, eps)
