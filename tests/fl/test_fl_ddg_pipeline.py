"""The distributed discrete Gaussian as a task option, end to end and under attack.

* Over the pipeline (devices → collector → job): a ``"noise": {"kind": "distributed_discrete_gaussian"}``
  task releases models, its status states ε against each adversary, the server operator's included.
* The attack: a server that holds everything it sees in a round (every masked input, every revealed
  share, the unmasked sum) computes the best estimate it can of the sum of clipped updates; with
  distributed noise the residual has the noise's variance; on the central-noise path it is zero.
* Devices refuse a round whose noise differs from the signed task configuration's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from estimator.fl.ddg_accounting import DDGAccountant
from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from ldp_core.fl.ddg import DDGSpec
from ldp_core.fl.errors import FLError
from ldp_core.fl.secagg import Quantizer, SecAggClient
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import JobThread, Topics, collector, devices_for, drive, make_data, task_spec

DDG = {"kind": "distributed_discrete_gaussian", "bits": 16}


def _ddg_task(name: str, **kw: Any) -> Any:
    base: dict[str, Any] = dict(
        secagg=True, sampling={"kind": "fixed", "count": 5}, rounds=2, noise_multiplier=1.0, noise=DDG
    )
    base.update(kw)
    return task_spec(name, 6, **base)


def test_task_option_is_validated_and_round_trips() -> None:
    spec = _ddg_task("ddg-opt")
    assert spec.to_dict()["noise"]["bits"] == 16
    assert type(spec).from_dict({**spec.to_dict()}).noise == spec.noise
    assert "ddg" in spec.signed_config()
    with pytest.raises(FLError, match="needs secagg"):
        _ddg_task("x", secagg=False)
    with pytest.raises(FLError, match="fixed-count sampling"):
        _ddg_task("x", sampling={"kind": "poisson", "rate": 0.5})
    with pytest.raises(FLError, match="bits must be"):
        _ddg_task("x", noise={"kind": "distributed_discrete_gaussian", "bits": 64})
    with pytest.raises(FLError, match="assumed_honest_fraction"):
        _ddg_task("x", noise={"kind": "distributed_discrete_gaussian", "bits": 16, "assumed_honest_fraction": 0})
    with pytest.raises(FLError, match="no options"):
        _ddg_task("x", noise={"kind": "distributed_discrete_gaussian", "bits": 16, "sigma": 1})


def test_ddg_rounds_over_the_pipeline_report_epsilon_against_the_server(tmp_path: Path) -> None:
    spec = _ddg_task("ddg-e")
    data = make_data(6)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    with (
        open_transport(url) as tr,
        collector(tmp_path, url, topics) as srv,
        JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt,
    ):
        devices = devices_for(srv.url, spec, data)
        drive(devices, jt.finished, timeout=90)
        status = jt.result
    assert status is not None and len(status["history"]) == 2, status
    for rec in status["history"]:
        assert rec["noise"] == "distributed_discrete_gaussian" and rec["bits"] == 16
        assert rec["modular_clipping_bound"] < 1e-5
    for d in devices:
        assert all(int(q.max()) < 2**16 and q.shape == (8,) for q in d.quantized.values())
    expect = DDGAccountant(spec.delta)
    ddg = spec.noise.build(spec, 5)
    for _ in range(2):
        expect.record(ddg)
    by = {a["adversary"]: a for a in status["epsilon_by_adversary"]}
    assert math.isclose(by["server_operator"]["epsilon"], expect.epsilon(), rel_tol=1e-9)
    assert by["observer"]["epsilon"] == by["knows_sample"]["epsilon"] == by["server_operator"]["epsilon"]
    assert "never an un-noised sum" in by["server_operator"]["sees"]
    # beside it, the figure for the task's assumed honest share of the sample (default half: issue 28)
    h = spec.noise.honest_shares(spec)
    assert h == math.ceil(spec.sampling.count / 2)
    assert math.isclose(by["server_operator"]["epsilon_assumed_honest"], expect.epsilon(shares=h), rel_tol=1e-9)
    assert by["server_operator"]["epsilon_all_honest"] == by["server_operator"]["epsilon"]
    for rec in status["history"]:
        assert rec["assumed_honest_shares"] == h and rec["epsilon_assumed_honest"] > rec["epsilon"]
    assert status["rejected"] == {}


# -- the attack ---------------------------------------------------------------------------------------
def _round(path: str, xs: np.ndarray, rng: np.random.Generator, c: float, z: float) -> tuple[np.ndarray, float]:
    """One SecAgg round on the real device and server code; returns (what the server computes for the sum
    of clipped updates from everything it holds, the variance it would have if the noise were unknown)."""
    n, d = xs.shape
    if path == "ddg":
        spec = DDGSpec.for_bits(c, z * c, n, d, 16)
        length, seed = spec.padded_dim, int(rng.integers(2**31))
        words = {u: spec.encode(xs[u - 1], rng, seed) for u in range(1, n + 1)}
        bits = spec.bits
    else:
        q = Quantizer.for_clients(n, c)
        length, bits = d, 32
        clipped = [x * min(1.0, c / np.linalg.norm(x)) for x in xs]
        words = {u: q.quantize(clipped[u - 1], rng) for u in range(1, n + 1)}
    cfg = make_config(1, n, length, rng)
    clients = {u: SecAggClient(u, cfg, rng.bytes) for u in range(1, n + 1)}
    server = SecAggServer(cfg)
    routed = server.collect_adverts([cl.advertise_keys() for cl in clients.values()])
    inbox = server.route_shares({u: cl.share_keys(routed[u]) for u, cl in clients.items()})
    for u, cl in clients.items():
        server.receive_masked(u, cl.masked_input(words[u], inbox.get(u, {}), bits=bits))
    surv, dropped = server.unmask_request()
    total = server.finish(honest_unmask(clients, surv, dropped))
    # the server's best estimate of Σ clip(x_u): decode what it unmasked (the central path adds its noise
    # only afterwards, so it holds this value before any noise)
    if path == "ddg":
        return spec.decode_sum(total.astype(np.int64), seed), spec.noise_variance()
    return q.decode_sum(total), (z * c) ** 2


def _residuals(path: str, trials: int = 150) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(11)
    c, z, n, d = 0.5, 1.0, 5, 5
    out, var = [], 0.0
    for _ in range(trials):
        xs = rng.normal(size=(n, d))
        truth = sum(x * min(1.0, c / np.linalg.norm(x)) for x in xs)
        est, var = _round(path, xs, rng, c, z)
        out.append(est - truth)
    return np.concatenate(out), var


def _assert_residual_has_the_noise_variance(res: np.ndarray, var: float) -> None:
    """Mean 0 and variance ``var`` within 5 standard errors (SE(mean) = √(var/N); SE(variance) =
    var·√(2/N), the residual being a sum of discrete Gaussian shares, Gaussian to within the
    rounding's small contribution)."""
    n = res.size
    assert abs(float(res.mean())) <= 5 * math.sqrt(var / n)
    assert abs(float(res.var(ddof=1)) - var) <= 5 * var * math.sqrt(2.0 / n), (float(res.var()), var)


def test_a_server_with_everything_it_sees_cannot_recover_the_unnoised_sum() -> None:
    res, var = _residuals("ddg")
    assert math.isclose(var, 0.25, rel_tol=1e-4)  # (σ·C)² with σ = 1, C = 0.5
    _assert_residual_has_the_noise_variance(res, var)


def test_on_the_central_noise_path_the_server_holds_the_exact_sum() -> None:
    """The same attack on the central-noise code path: the server's estimate *is* the un-noised sum (the
    residual is quantization only, below 1e-8), so the check above fails there."""
    res, var = _residuals("central", trials=40)
    assert float(np.max(np.abs(res))) < 1e-8
    with pytest.raises(AssertionError):
        _assert_residual_has_the_noise_variance(res, var)


def test_device_refuses_a_round_whose_noise_is_not_the_signed_one() -> None:
    """A server that drops the ``ddg`` entry from a round (to receive un-noised quantized inputs), or adds
    one the task does not fix, or changes the ring, is refused by the device before it sends anything."""
    from client_sdk.fl.device import FLDevice

    spec = _ddg_task("ddg-sig")
    dev = FLDevice("http://127.0.0.1:1", spec.task, "dev-0", np.zeros((1, 4)), np.zeros(1))
    view = {"task_config": {"config": spec.signed_config()}}
    sa = {"ddg": {"bits": 16, "rotation_seed": 3}, "vector_length": 8}
    assert dev._signed_ddg(view, sa) is not None
    with pytest.raises(FLError, match="not the one the signed"):
        dev._signed_ddg(view, {"vector_length": 8})
    with pytest.raises(FLError, match="differs"):
        dev._signed_ddg(view, {"ddg": {"bits": 12, "rotation_seed": 3}, "vector_length": 8})
    central = task_spec("central", 6, secagg=True, sampling={"kind": "fixed", "count": 5})
    with pytest.raises(FLError, match="not the one the signed"):
        dev._signed_ddg({"task_config": {"config": central.signed_config()}}, sa)
