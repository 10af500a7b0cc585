"""Count-sketched updates under SecAgg (issue 18: ``{"kind": "count_sketch", ...}``): the option's
validation and signing, the decoder's unbiasedness and variance, the sensitivity against a seed the
server picks, an empirical privacy audit of the job's release, the device's refusals, and two rounds
over devices → collector → job with packed ring words."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk.fl.device import FLDevice
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.ring_sketch import RingCountSketch, ring_compression_from_signed
from ldp_core.wire.framing import unpack_headed
from pipeline.transport import open_transport
from tests.support.audit import threshold_epsilon_lower_bound
from tests.support.fl_pipeline_support import JobThread, Topics, collector, devices_for, drive, make_data, task_spec

FEATURES = 40  # logistic regression: 41 parameters
SKETCH = {"kind": "count_sketch", "rows": 3, "cols": 8, "bits": 8}


def _task(name: str, **kw: Any) -> Any:
    base: dict[str, Any] = dict(
        model={"kind": "logistic", "n_features": FEATURES, "l2": 0.0},
        secagg=True,
        sampling={"kind": "fixed", "count": 5},
        rounds=2,
        noise_multiplier=1.0,
        compression=dict(SKETCH),
    )
    base.update(kw)
    return task_spec(name, 6, **base)


def _ring_sum(rcs: RingCountSketch, xs: np.ndarray, seed: int, rng: np.random.Generator) -> np.ndarray:
    """What the job unmasks: the devices' codes summed in Z_{2^ring_bits} (the masks cancel)."""
    codes = np.stack([rcs.encode(x, seed, rng) for x in xs]).astype(np.uint64)
    return codes.sum(axis=0) % (1 << rcs.ring_bits)


def test_option_is_signed_validated_and_round_trips() -> None:
    spec = _task("cs-opt")
    signed = spec.signed_config()["compression"]
    # 6 clients need 3 more bits than the 8-bit codes: Z_{2^11}; the sketch's clip defaults to C = 0.5
    assert signed == {"kind": "count_sketch", "rows": 3, "cols": 8, "bits": 8, "clip": 0.5, "ring_bits": 11}
    assert ring_compression_from_signed(signed) == spec.build_compression()
    assert type(spec).from_dict(spec.to_dict()).compression == spec.compression
    rcs = spec.build_compression()
    assert rcs.length(41) == 24 and rcs.payload_bytes(41) == 33  # ⌈24·11/8⌉, against 4·41 = 164 as float32
    # the sensitivity is the clipped sketch's: clip + Δ·√(rows·cols), Δ = 2·clip/(2^8 − 1)
    assert rcs.sensitivity(0.5, 41) == pytest.approx(0.5 + (1.0 / 255) * math.sqrt(24))


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"compression": {**SKETCH, "rows": 6, "cols": 8}}, "do not compress"),
        ({"compression": {**SKETCH, "rows": 0}}, "rows must be"),
        ({"compression": {**SKETCH, "cols": 2.5}}, "cols must be"),
        ({"compression": {**SKETCH, "bits": 40}}, "bits must be"),
        ({"compression": {**SKETCH, "median": True}}, "unknown options"),
        ({"secagg": False}, "runs with secagg"),
        ({"aggregator": {"kind": "dp_ftrl"}}, "fedavg aggregator"),
    ],
)
def test_combinations_that_do_not_compose_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(FLError, match=match):
        _task("x", **kw)


def test_decoder_is_unbiased_with_the_collision_and_rounding_variance() -> None:
    """5 devices' codes through the ring, decoded with fresh public hashes each trial. Per coordinate i of
    the sum X, the row-mean decoder's error has variance Σ_{j≠i} X_j²/(rows·cols) over fully random hashes
    and signs (each j collides with probability 1/cols in each of the independent rows) plus the
    rounding's, at most n·Δ²/4 (each cell's rounding variance ≤ Δ²/4 per device, averaged over rows and
    scaled by √rows back). Unbiased: the mean error within 5 standard errors of 0; the variance between
    0.8 × the collision part and 1.2 × the bound (800 trials: the sample variance's relative spread is
    √(2/800) = 5 %). A decoder missing the √rows rescaling would be off by 1 − 1/√3 of X."""
    rcs = RingCountSketch.for_task({**SKETCH, "clip": 4.0}, 1.0, 6, FEATURES + 1)
    rng = np.random.default_rng(31)
    xs = rng.normal(scale=0.15, size=(5, FEATURES + 1))
    X = xs.sum(axis=0)
    trials = 800
    errs = np.empty((trials, X.size))
    for t in range(trials):
        assert all(np.linalg.norm(rcs.sketcher(X.size, t).sketch(x)) / math.sqrt(3) < 4.0 for x in xs)  # no clip
        errs[t] = rcs.decode_sum(_ring_sum(rcs, xs, t, rng), 5, t, X.size) - X
    collision = (np.sum(X**2) - X**2) / (3 * 8)
    bound = collision + 5 * rcs.quantizer.step**2 / 4
    assert np.all(np.abs(errs.mean(axis=0)) <= 5 * np.sqrt(bound / trials))
    var = errs.var(axis=0)
    assert np.all(var <= 1.2 * bound) and np.all(var >= 0.8 * collision)


def _adversarial(rcs: RingCountSketch, dim: int, clip: float) -> tuple[int, np.ndarray]:
    """A seed a malicious server could pick (the heaviest bucket in 400 tries) and the update of norm C
    that lines up with it: row 0's heaviest cell sums all of it, so the sketch's gain is √(bucket)."""
    best = max(range(400), key=lambda s: rcs.sketcher(dim, s).max_bucket())
    buckets, signs = rcs.sketcher(dim, best)._hashes()
    heavy = np.bincount(buckets[0], minlength=rcs.cols).argmax()
    x = np.where(buckets[0] == heavy, signs[0], 0.0)
    return best, clip * x / np.linalg.norm(x)


def test_the_sensitivity_holds_for_a_seed_the_server_picks() -> None:
    rcs = RingCountSketch.for_task(dict(SKETCH), 0.5, 6, FEATURES + 1)
    seed, x = _adversarial(rcs, FEATURES + 1, 0.5)
    raw = rcs.sketcher(FEATURES + 1, seed).sketch(x) / math.sqrt(rcs.rows)
    # unclipped, this seed and update exceed the bound: without the clip in sketch space, the sensitivity
    # would be the seed's √(max bucket)·C
    assert np.linalg.norm(raw) > 1.5 * rcs.sensitivity(0.5, FEATURES + 1)
    assert np.linalg.norm(rcs.clipped_sketch(x, seed)) == pytest.approx(0.5)
    rng = np.random.default_rng(5)
    norms = [np.linalg.norm(rcs.quantizer.dequantize(rcs.encode(x, seed, rng))) for _ in range(300)]
    assert max(norms) <= rcs.sensitivity(0.5, FEATURES + 1)
    # and for random updates at the clip boundary, any seed
    for s in range(200):
        v = rng.normal(size=FEATURES + 1)
        v *= 0.5 / np.linalg.norm(v)
        assert np.linalg.norm(rcs.quantizer.dequantize(rcs.encode(v, s, rng))) <= rcs.sensitivity(0.5, FEATURES + 1)


def _audit(sigma: float, trials: int, seed: int) -> float:
    """A 95 % lower bound on ε at δ = 1e-5 from telling apart the job's release (:meth:`RingCountSketch.release`)
    with the target device among the survivors or not (add/remove; the decoder is told each sum's count, so
    the two summed sketches differ by exactly the target's quantized sketch q, ‖q‖ ≤ S). The target is the
    server's worst case: the adversarial seed and the update aligned with its heaviest bucket. The attacker
    projects the release on the target's update and thresholds; τ on one half of the trials,
    Clopper–Pearson on the other (Jagielski et al. 2020)."""

    dim = FEATURES + 1
    rcs = RingCountSketch.for_task(dict(SKETCH), 0.5, 6, dim)
    hash_seed, target = _adversarial(rcs, dim, 0.5)
    rng = np.random.default_rng(seed)
    others = rng.normal(scale=0.05, size=(3, dim))
    sd = sigma * rcs.sensitivity(0.5, dim)
    u = target / np.linalg.norm(target)

    def release(xs: np.ndarray) -> float:
        return float(rcs.release(_ring_sum(rcs, xs, hash_seed, rng), len(xs), hash_seed, dim, sd, rng) @ u)

    inn = np.array([release(np.vstack([others, target])) for _ in range(trials)])
    out = np.array([release(others) for _ in range(trials)])
    return threshold_epsilon_lower_bound(out, inn)


def test_audit_of_the_release_stays_within_the_gaussian_epsilon() -> None:
    """The claimed figure is the Gaussian mechanism's at μ = S/(σ·S) = 1/σ for one round (Balle and Wang
    2018, via dp-accounting): what the accountant records for the round."""
    from estimator.accounting.accountant import exact_gaussian_epsilon
    from ldp_core.privacy_events import GaussianEvent

    claimed = exact_gaussian_epsilon(GaussianEvent(1.0), 1e-5)
    assert claimed is not None
    lower = _audit(1.0, trials=3000, seed=8)
    assert lower <= claimed
    # the attack is real: a Gaussian with μ ≈ 1 shows ε ≈ 1 on 1,500 test draws at this confidence
    assert lower > 0.3


def test_device_refuses_a_round_whose_sketch_is_not_the_signed_one() -> None:
    spec = _task("cs-r")
    signed = spec.signed_config()
    dev = FLDevice("http://127.0.0.1:9", "cs-r", "dev-0", np.zeros((1, FEATURES)), np.zeros(1))
    view = {"task_config": {"config": signed}}
    good = {"rotation_seed": 3, **signed["compression"]}
    assert isinstance(dev._signed_compression(view, {"compression": good}), RingCountSketch)
    for bad in ({**good, "cols": 4}, {**good, "clip": 5.0}, {**good, "kind": "quantize"}, {**good, "ring_bits": 32}):
        with pytest.raises(FLError, match="differ"):
            dev._signed_compression(view, {"compression": bad})
    with pytest.raises(FLError, match="unusable"):
        dev._signed_compression(
            {"task_config": {"config": {**signed, "compression": {"kind": "count_sketch"}}}}, {"compression": good}
        )
    with pytest.raises(ModelError, match="unusable"):
        ring_compression_from_signed({**signed["compression"], "ring_bits": 8})  # codes would wrap the ring


def test_sketched_rounds_over_the_pipeline(tmp_path: Path) -> None:
    spec = _task("cs-e")
    rcs = spec.build_compression()
    data = make_data(6, n_features=FEATURES)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    sent: list[bytes] = []
    with (
        open_transport(url) as tr,
        collector(tmp_path, url, topics) as srv,
        JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt,
    ):
        devices = devices_for(srv.url, spec, data)
        for d in devices:
            real = d._request

            def request(method: str, url: str, body: bytes | None = None, *a: Any, _r: Any = real, **kw: Any) -> Any:
                if body is not None and body[:4] == b"LDPU":
                    head, _ = unpack_headed(body, b"LDPU", "upload")
                    if json.loads(head)["kind"] == "masked":
                        sent.append(body)
                return _r(method, url, body, *a, **kw)

            d._request = request  # type: ignore[method-assign]
        drive(devices, jt.finished, timeout=90)
        status = jt.result
    assert status is not None and len(status["history"]) == 2, status
    for rec in status["history"]:
        assert "failed" not in rec, (rec, [d.errors for d in devices])
        assert len(rec["secagg_survivors"]) == 5
        assert rec["noise_stddev"] == pytest.approx(spec.noise_multiplier * rcs.sensitivity(0.5, FEATURES + 1))
    assert len(sent) == 10
    for b in sent:  # 24 cells of 11 bits packed: 33 bytes, not 4 · 41 = 164
        head, raw = unpack_headed(b, b"LDPU", "upload")
        assert json.loads(head)["payload"] == {"ring_bits": 11, "length": 24} and len(raw) == 33
    for d in devices:  # each device masked 24 codes of 8 bits
        assert all(q.shape == (24,) and int(q.max()) < 2**8 for q in d.quantized.values())
