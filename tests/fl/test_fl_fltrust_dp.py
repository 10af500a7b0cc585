"""DP-FLTrust: ``{"kind": "fltrust", "root_data": ..., "divisor": "expected_clients"}`` with client-level DP.

* Sensitivity, played by the adversary: whatever a client uploads (huge norms, exactly aligned with g₀, against
  a g₀ far above C), its contribution TSᵢ·ḡᵢ has norm ≤ C, and the σ = 0 release moves by at most C/m̄ when one
  client is added or removed (the paper's total-trust divisor moves far more: the reason for the option).
* Statistics: over seeded rounds the released noise has per-coordinate variance (σC/m̄)² and mean zero around
  the un-noised fixed-divisor aggregate, which equals a hand computation.
* An empirical privacy audit of the job's release (target present vs absent) within the accountant's ε, with
  the attack shown real and a halved noise caught.
* Over the pipeline (devices → collector → job) with 3 of 10 sign flippers: the job equals the in-process run
  bit for bit, reports ε (equal to the accountant's) and the adversaries' labels, keeps its accuracy; the
  step-size shrink Σ TSᵢ/m̄ is measured.
* Refusals: DP without the opt-in, the opt-in without C, SecAgg, a bad divisor.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.accounting.accountant import exact_gaussian_epsilon
from estimator.fl.aggregators import RoundContext, WeightedMean
from estimator.fl.dp import FLTRUST_OPERATOR_SEES, ClientLevelAccountant, DPFLTrust, fltrust_contributions
from estimator.fl.robust import FLTrust
from estimator.fl.sampling import FixedCountSampling, PoissonSampling
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import accuracy
from ldp_core.fl.training import ClientUpdate
from ldp_core.privacy_events import GaussianEvent
from tests.support.audit import threshold_epsilon_lower_bound
from tests.support.fl_pipeline_support import (
    devices_for,
    drive,
    final_params,
    reference_run,
    run_with_restart,
    running_task,
    scaled_updates,
    served_status,
    task_spec,
)
from tests.support.fltrust_setup import ATTACKERS, DATA, N_CLIENTS, ROOT, SCALE, X_TEST, Y_TEST

DIM = 5  # logistic regression on 4 features


def _spec(tmp: Path, name: str = "fltrust-dp", **kw: Any) -> FLTaskSpec:
    path = tmp / "root.npz"
    if not path.exists():
        np.savez(path, x=ROOT[0], y=ROOT[1])
    base: dict[str, Any] = dict(
        rounds=4,
        clip_norm=0.5,
        noise_multiplier=0.8,
        sampling={"kind": "fixed", "count": N_CLIENTS},
        aggregator={"kind": "fltrust", "root_data": str(path), "divisor": "expected_clients"},
    )
    base.update(kw)
    return task_spec(name, N_CLIENTS, **base)


def _ups(X: np.ndarray, r: int = 0, prefix: str = "c") -> list[ClientUpdate]:
    return [ClientUpdate(f"{prefix}{i}", r, np.asarray(x, np.float32), 1) for i, x in enumerate(X)]


def _ctx(seed: int, m: float, r: int = 0) -> RoundContext:
    return RoundContext(r, DIM, np.random.default_rng(seed), m, params=np.zeros(DIM, np.float32))


# -- (1) sensitivity, played by the adversary ------------------------------------------------------------
def test_no_upload_moves_the_sum_by_more_than_c() -> None:
    C, m = 0.5, 4.0
    rng = np.random.default_rng(11)
    g0 = rng.normal(size=DIM)
    g0 *= 1e3 / np.linalg.norm(g0)  # far above C: the job clips it to C
    honest = rng.normal(size=(3, DIM)) + 0.3 * g0 / 1e3
    attacks = [
        1e30 * g0 / np.linalg.norm(g0),  # huge and exactly aligned: trust 1
        g0.copy(),  # the root update itself
        1e-30 * g0,  # tiny and aligned
        -1e30 * g0,  # huge and opposed: trust 0
        *(1e20 * rng.normal(size=(20, DIM))),  # huge in random directions
        *(g0 + 1e-3 * rng.normal(size=(20, DIM))),  # nearly aligned
        np.zeros(DIM),
    ]
    mech = DPFLTrust(lambda ctx: g0, C, 0.0)
    for a in attacks:
        a32 = np.asarray(a, np.float32)
        contrib, ts, r = fltrust_contributions(np.vstack([honest, a32[None]]), g0, C)
        assert r == C and np.all((ts >= 0) & (ts <= 1))
        # ≤ C up to float64 rounding of a unit vector's norm (a few ulps)
        assert np.linalg.norm(contrib, axis=1).max() <= C * (1 + 1e-12)
        with_a = mech.aggregate(_ups(np.vstack([honest, a32[None]])), _ctx(0, m)).delta
        without = mech.aggregate(_ups(honest), _ctx(0, m)).delta
        assert np.linalg.norm(with_a - without) <= C / m * (1 + 1e-12)
    # the bound is attained: the aligned client moves the release by C/m̄ exactly (to float32 rounding of g₀)
    top = mech.aggregate(_ups(np.vstack([honest, g0[None]])), _ctx(0, m)).delta
    assert np.linalg.norm(top - mech.aggregate(_ups(honest), _ctx(0, m)).delta) == pytest.approx(C / m, rel=1e-6)
    # the paper's divisor Σ TSᵢ: beside one honest client of trust 0.05, an aligned attacker drags the release
    # from that client's rescaled update (norm ‖g₀‖) to nearly g₀: a move of order ‖g₀‖, not C/m̄
    plain = FLTrust(WeightedMean(), lambda ctx: g0)
    u0 = g0 / np.linalg.norm(g0)
    lone = rng.normal(size=DIM)
    lone -= (lone @ u0) * u0
    lone = 0.05 * u0 + math.sqrt(1 - 0.05**2) * lone / np.linalg.norm(lone)  # a unit vector with cos 0.05
    both = plain.aggregate(_ups(np.vstack([lone, g0])), _ctx(0, m)).delta
    alone = plain.aggregate(_ups(lone[None]), _ctx(0, m)).delta
    assert np.linalg.norm(both - alone) > 1000 * C / m  # about 1.3·‖g₀‖ = 1300 against C/m̄ = 0.125


def test_the_tasks_stack_clips_the_root_update(tmp_path: Path) -> None:
    """The spec-built stack (real root training) with C below ‖g₀‖: rescale norm C, the operator's record."""
    spec = _spec(tmp_path, clip_norm=0.01)
    acc = spec.build_accountant()
    agg = spec.build_aggregator(acc)
    assert isinstance(agg.inner, DPFLTrust) and isinstance(acc, ClientLevelAccountant)  # type: ignore[attr-defined]
    ctx = RoundContext(0, DIM, np.random.default_rng(1), float(N_CLIENTS), params=np.zeros(DIM, np.float32))
    g0 = agg.inner.root(ctx)  # type: ignore[attr-defined]
    ups = _ups(np.vstack([g0 * 1e6, -g0, np.ones(DIM)]))
    res = agg.aggregate(ups, ctx)
    assert (
        res.info["root_update_norm"] == pytest.approx(float(np.linalg.norm(g0))) and res.info["root_update_norm"] > 0.01
    )
    assert res.info["rescale_norm"] == 0.01 and res.info["noise_stddev"] == pytest.approx(0.8 * 0.01)
    assert res.info["trusted_clients"] in (1, 2) and res.total_weight == N_CLIENTS
    assert acc.rounds == 1 and res.info["epsilon"] == acc.epsilon()


# -- (2) the noise, statistically ------------------------------------------------------------------------
def test_released_noise_has_variance_sigma_c_over_m_squared() -> None:
    """3 uploads against m̄ = 4 expected (as under Poisson sampling): a divisor of the realized count (3) or of
    Σ TSᵢ would change the variance by a factor (4/3)² or more, which the tolerance excludes."""
    C, sigma, m, rounds = 0.5, 1.3, 4.0, 4000
    rng = np.random.default_rng(5)
    g0 = rng.normal(size=DIM)
    X = np.vstack([g0 + rng.normal(size=DIM), 3 * g0, -g0]).astype(np.float32)
    ups = _ups(X)
    mech = DPFLTrust(lambda ctx: g0, C, sigma)
    # the un-noised fixed-divisor aggregate by hand: TSᵢ = max(0, cos) and ḡᵢ = min(‖g₀‖, C)·Δᵢ/‖Δᵢ‖
    want = np.zeros(DIM)
    for x in X.astype(np.float64):
        cos = float(x @ g0) / (np.linalg.norm(x) * np.linalg.norm(g0))
        want += max(0.0, cos) * min(float(np.linalg.norm(g0)), C) * x / np.linalg.norm(x)
    want /= m
    np.testing.assert_allclose(DPFLTrust(lambda ctx: g0, C, 0.0).aggregate(ups, _ctx(0, m)).delta, want, rtol=1e-12)
    gen = np.random.default_rng(2026)
    out = np.stack([mech.aggregate(ups, RoundContext(0, DIM, gen, m, params=None)).delta for _ in range(rounds)])
    noise = out - want
    var = (sigma * C / m) ** 2
    # chi-square: (n − 1)s²/σ² ~ χ²(n − 1), so Var(s²) = 2σ⁴/(n − 1); 4.5 standard deviations per coordinate
    # (5 coordinates, two-sided: a false failure below 1e-4)
    s2 = noise.var(axis=0, ddof=1)
    assert np.all(np.abs(s2 - var) <= 4.5 * var * math.sqrt(2 / (rounds - 1))), (s2, var)
    # the mean: each coordinate's sample mean has standard error σC/(m̄√n)
    assert np.all(np.abs(noise.mean(axis=0)) <= 4.5 * math.sqrt(var / rounds)), noise.mean(axis=0)


# -- (3) the privacy audit --------------------------------------------------------------------------------
AUDIT_DELTA = 0.05  # the δ where 2,000 test draws per world have power (the claimed ε(δ) holds at every δ)


def _audit(tmp: Path, sigma_used: float, trials: int, seed: int) -> float:
    """A ~90 % lower bound on ε at :data:`AUDIT_DELTA` from telling apart the job's release (the spec-built
    ``DPFLTrust`` with its real root update, noise multiplier ``sigma_used``) with the target client present or
    absent (add/remove, the sample known). The target is the worst case: its update aligned with g₀ and a
    million times longer (trust 1, contribution exactly C). The attacker projects the release on g₀ and
    thresholds (:func:`tests.support.audit.threshold_epsilon_lower_bound`: τ on one half, Clopper–Pearson on
    the other)."""
    spec = _spec(tmp, clip_norm=0.05, noise_multiplier=sigma_used)
    mech = spec.build_aggregator(None).inner  # type: ignore[attr-defined]
    params = np.zeros(DIM, np.float32)
    g0 = mech.root(RoundContext(0, DIM, np.random.default_rng(0), 4.0, params=params))
    assert np.linalg.norm(g0) > spec.clip_norm  # g₀ is clipped: the rescaled length is C
    fixed = dataclasses.replace(mech, root=lambda ctx: g0)  # the same g₀ each trial, without retraining
    others = _ups(np.random.default_rng(seed).normal(scale=0.05, size=(3, DIM)))
    target = ClientUpdate("target", 0, (1e6 * g0).astype(np.float32), 1)
    u = g0 / np.linalg.norm(g0)
    rng = np.random.default_rng(seed)

    def release(ups: list[ClientUpdate]) -> float:
        return float(fixed.aggregate(ups, RoundContext(0, DIM, rng, 4.0, params=params)).delta @ u)

    inn = np.array([release([*others, target]) for _ in range(trials)])
    out = np.array([release(others) for _ in range(trials)])
    return threshold_epsilon_lower_bound(out, inn, delta=AUDIT_DELTA)


def test_audit_of_the_release_stays_within_the_accountants_epsilon(tmp_path: Path) -> None:
    """One round at σ = 1 with the target's presence known: the accountant's known-sample figure, the exact
    Gaussian ε at μ = C/(σC) = 1 (Balle and Wang 2018). At δ = 0.05 it is 1.57; the same mechanism with the
    noise halved (μ = 2) has ε 4.57 there, and the attack must see more than the claim."""
    claimed = exact_gaussian_epsilon(GaussianEvent(1.0), AUDIT_DELTA)
    assert claimed is not None
    # what the job's accountant charges a Poisson-sampled task's round (add/remove neighbours, as audited) for
    # whoever knows the sample (an observer's amplified figure is lower, but the audit fixes the sample)
    acc = ClientLevelAccountant(PoissonSampling(0.5), 8, AUDIT_DELTA)
    acc.record(1.0)
    assert acc.epsilon_known_sample() == pytest.approx(claimed, rel=1e-6)
    lower = _audit(tmp_path, 1.0, trials=4000, seed=8)
    assert 0.5 < lower <= claimed, (lower, claimed)  # the attack is real, and within the claim
    halved = _audit(tmp_path, 0.5, trials=4000, seed=9)
    assert halved > claimed, (halved, claimed)  # a mechanism with half the noise is caught


# -- (4) over the pipeline -------------------------------------------------------------------------------
_attack = scaled_updates(SCALE, ATTACKERS)


def test_dp_fltrust_task_over_the_pipeline(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    data = DATA[:N_CLIENTS]
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_tr, srv, jt):
        devices = devices_for(srv.url, spec, data, scale=dict.fromkeys(ATTACKERS, SCALE))
        drive(devices, jt.finished, timeout=60)
        status = jt.result
        served = served_status(srv.url, spec.task, lambda st: st.get("phase") == "done")  # anyone's view
    assert status is not None
    x_dp = final_params(status)
    ref, ref_history = reference_run(spec, data, tamper=_attack)
    assert np.array_equal(x_dp, ref)  # the job's root training and noise are the in-process ones, bit for bit
    assert status["accepted"] == {"update": 40} and status["rejected"] == {}
    # ε: the accountant's, for 4 rounds of σ = 0.8, every sampled client (10 of 10, replace-one neighbours)
    acc = ClientLevelAccountant(FixedCountSampling(N_CLIENTS), N_CLIENTS, spec.delta)
    for _ in range(spec.rounds):
        acc.record(spec.noise_multiplier)
    assert status["epsilon"] == pytest.approx(acc.epsilon(), rel=1e-9) and math.isfinite(status["epsilon"])
    by = {a["adversary"]: a for a in status["epsilon_by_adversary"]}
    assert by["observer"]["epsilon"] == pytest.approx(acc.epsilon(), rel=1e-9)
    assert by["knows_sample"]["epsilon"] == pytest.approx(acc.epsilon_known_sample(), rel=1e-9)
    assert by["server_operator"]["epsilon"] is None and by["server_operator"]["sees"] == FLTRUST_OPERATOR_SEES
    assert served["epsilon"] == pytest.approx(acc.epsilon(), rel=1e-9)  # the public status carries ε too
    text = json.dumps(served)  # and nothing of the scores (the operator's history only)
    assert served["aggregator"] == "fltrust" and "trust_scores" not in text and "trust_total" not in text
    m = float(N_CLIENTS)
    for h, rh in zip(status["history"], ref_history, strict=True):
        assert h["trust_scores"] == sorted(rh.info["trust_scores"].values(), reverse=True)
        assert h["trust_scores"][-len(ATTACKERS) :] == [0.0] * len(ATTACKERS)  # the flippers get no trust
        assert h["trust_total"] == pytest.approx(sum(h["trust_scores"]))
        assert h["noise_stddev"] == pytest.approx(0.8 * 0.5) and h["clip_norm"] == 0.5
        assert not any(c in json.dumps(h) for c in spec.clients)
    # the step-size consequence: against the paper's divisor the step is Σ TSᵢ/m̄ as long (7 trusted of 10,
    # each cos < 1), measured each round
    shrink = [h["trust_total"] / m for h in status["history"]]
    assert all(0 < s < 0.7 for s in shrink), shrink
    # accuracy on 96 test examples against the clean FedAvg run (binomial standard error ≤ 0.051): DP-FLTrust
    # under the attack stays within 3 standard errors of it
    fedavg = dataclasses.replace(spec, aggregator={"kind": "fedavg"}, clip_norm=None, noise_multiplier=0.0)  # type: ignore[arg-type]
    plain = dataclasses.replace(
        spec,
        aggregator={"kind": "fltrust", "root_data": str(tmp_path / "root.npz")},  # type: ignore[arg-type]
        clip_norm=None,
        noise_multiplier=0.0,
    )
    x_clean, _ = reference_run(fedavg, data)
    x_ft, _ = reference_run(plain, data, tamper=_attack)
    model = spec.build_model()
    x0 = model.init_params(np.random.default_rng(spec.seed)).astype(np.float64)
    acc_of = {k: accuracy(model, v, X_TEST, Y_TEST) for k, v in (("clean", x_clean), ("fltrust", x_ft), ("dp", x_dp))}
    travel = {k: float(np.linalg.norm(v.astype(np.float64) - x0)) for k, v in (("fltrust", x_ft), ("dp", x_dp))}
    print(  # the figures docs/fl/FLTRUST.md quotes (pytest -s)
        f"DP-FLTrust pipeline: epsilon {status['epsilon']:.2f}, step scale Σ TSᵢ/m̄ {[round(v, 3) for v in shrink]}, "
        f"rescale norm {[round(h['rescale_norm'], 3) for h in status['history']]}, "
        f"root norm {[round(h['root_update_norm'], 3) for h in status['history']]}, "
        f"travel {travel}, accuracy {acc_of}"
    )
    # the model moves less far than FLTrust's in the same rounds: the step is scaled by Σ TSᵢ/m̄ < 1
    assert travel["dp"] < travel["fltrust"], travel
    se = max(math.sqrt(acc_of["clean"] * (1 - acc_of["clean"]) / len(Y_TEST)), 1.0 / len(Y_TEST))
    assert acc_of["dp"] >= acc_of["clean"] - 3 * se, (acc_of, shrink)


def test_dp_fltrust_task_restarted_mid_run_ends_with_the_same_model_and_epsilon(tmp_path: Path) -> None:
    """Stopped after round 2 and restarted: the noise generator and the accountant come back from the
    checkpoint (its noise history), so the model is the uninterrupted run's and ε its accountant's."""
    spec = _spec(tmp_path, "fltrust-dp-restart")
    data = DATA[:N_CLIENTS]
    ref, history = reference_run(spec, data)

    def check(jt: Any, restored: dict[str, Any]) -> None:
        done = len(restored["history"])
        assert restored["epsilon"] == pytest.approx(history[done - 1].info["epsilon"], rel=1e-9)

    status = run_with_restart(tmp_path, spec, data, check)
    assert np.array_equal(final_params(status), ref)
    assert [h["epsilon"] for h in status["history"]] == pytest.approx([h.info["epsilon"] for h in history], rel=1e-9)


# -- (5) refusals and the contract -----------------------------------------------------------------------
def test_dp_fltrust_contract_and_refusals(tmp_path: Path) -> None:
    path = str(tmp_path / "root.npz")
    _spec(tmp_path)  # writes the root file
    plain = {"kind": "fltrust", "root_data": path}
    with pytest.raises(FLError, match='without client-level DP.*2‖g₀‖.*"divisor": "expected_clients"'):
        _spec(tmp_path, aggregator=plain)
    with pytest.raises(FLError, match="without client-level DP"):
        _spec(tmp_path, aggregator={**plain, "divisor": "total_trust"}, clip_norm=0.5, noise_multiplier=0.0)
    with pytest.raises(FLError, match="DP-FLTrust and needs clip_norm"):
        _spec(tmp_path, clip_norm=None, noise_multiplier=0.0)
    with pytest.raises(FLError, match="secure aggregation reveals only their sum"):
        _spec(tmp_path, secagg=True)
    with pytest.raises(FLError, match="divisor must be one of.*got 'count'"):
        _spec(tmp_path, aggregator={**plain, "divisor": "count"})
    dpsgd = {"noise_multiplier": 1.0, "clip": 1.0, "sample_rate": 0.5, "steps": 2}
    with pytest.raises(FLError, match="local_dp_sgd"):
        _spec(tmp_path, training={"learning_rate": 0.5}, local_dp_sgd=dpsgd)
    with pytest.raises(FLError, match="control-variate"):
        _spec(tmp_path, algorithm="scaffold")
    with pytest.raises(FLError, match="clip_norm must be"):
        _spec(tmp_path, clip_norm=-1.0)
    # accepted: the option round-trips (the default is left out of the file), Poisson sampling, σ = 0 (ε = ∞)
    spec = _spec(tmp_path, sampling={"kind": "poisson", "rate": 0.5})
    assert spec.aggregator.to_dict() == {**plain, "sha256": None, "divisor": "expected_clients"}
    assert FLTaskSpec.from_dict(spec.to_dict()) == spec
    assert isinstance(spec.build_accountant(), ClientLevelAccountant) and spec.device_clip_norm is None
    assert _spec(tmp_path, noise_multiplier=0.0).build_accountant() is not None
    assert FLTaskSpec.from_dict({**spec.to_dict(), "clip_norm": None, "noise_multiplier": 0.0, "aggregator": plain})


# -- the poisoning scenario's DP row ------------------------------------------------------------------------
def test_poisoning_scenario_dp_row(capsys: pytest.CaptureFixture[str]) -> None:
    """``ldp fl attack --poisoning --dp-fltrust``: a sixth aggregator with its ε (the accountant's for every
    client in every round) and its step scale; without noise it resists 30 % sign flippers like FLTrust (within
    0.05 of its clean accuracy, the margin of tests/fl/test_fl_fltrust.py), and its step scale is below 0.7
    there (14 of 20 clients honest, each trust ≤ 1)."""
    from ldp_cli.main import main
    from simulator.scenarios.fl.poisoning import PoisoningConfig, dp_privacy, run_one

    cfg = PoisoningConfig(rounds=15, dp_noise_multiplier=0.0)
    clean = run_one(cfg, None, 0.0, "fltrust_dp")
    flipped = run_one(cfg, "sign_flip", 0.3, "fltrust_dp")
    assert flipped["accuracy"] >= clean["accuracy"] - 0.05 and clean["accuracy"] > 0.9, (clean, flipped)
    assert 0 < flipped["mean_step_scale"] < 0.7 < clean["mean_step_scale"] <= 1.0
    assert "mean_step_scale" not in run_one(cfg, None, 0.0, "fltrust")  # the plain rule has no such scale
    assert main(["fl", "attack", "--poisoning", "--dp-fltrust", "--rounds", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["clean_accuracy"]) == {"mean", "median", "trimmed_mean", "krum", "fltrust", "fltrust_dp"}
    assert len(out["results"]) == 3 * 3 * 6
    acc = ClientLevelAccountant(FixedCountSampling(20), 20, 1e-5)
    acc.record(1.0)
    assert out["fltrust_dp"] == dp_privacy(PoisoningConfig(rounds=1))
    assert out["fltrust_dp"]["epsilon"] == pytest.approx(acc.epsilon()) and out["fltrust_dp"]["clip_norm"] == 0.1
    with pytest.raises(SystemExit, match="needs --poisoning"):
        main(["fl", "attack", "--dp-fltrust"])
