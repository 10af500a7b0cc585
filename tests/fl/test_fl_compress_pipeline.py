"""Compressed updates as a task option (issue 18): ``"compression": {"kind": "quantize", ...}`` under SecAgg
through the real devices → collector → job path, and the refusals of what does not compose."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk.fl.compress import RingQuantization, StochasticQuantizer
from client_sdk.fl.errors import FLError
from pipeline.transport import open_transport
from tests.support.fl_pipeline_support import JobThread, Topics, collector, devices_for, drive, make_data, task_spec


def _task(name: str, **kw: Any) -> Any:
    base: dict[str, Any] = dict(
        secagg=True,
        sampling={"kind": "fixed", "count": 5},
        rounds=2,
        noise_multiplier=1.0,
        compression={"kind": "quantize", "bits": 6, "rotate": True},
    )
    base.update(kw)
    return task_spec(name, 6, **base)


def test_option_is_signed_validated_and_round_trips() -> None:
    spec = _task("cq-opt")
    signed = spec.signed_config()["compression"]
    # 6 clients need 3 more bits than the codes: Z_{2^9}; rotated: clip 4C/√D with D = 8 (5 parameters padded)
    # conditional rounding by default: B for C = 0.5 over D = 8 at β = 0.01, signed with the rest
    c = 4 * 0.5 / math.sqrt(8)
    bound = StochasticQuantizer(6, c).conditional_bound(0.5, 8, 0.01)
    assert signed == {
        "kind": "quantize",
        "bits": 6,
        "rotate": True,
        "clip": c,
        "ring_bits": 9,
        "rounding": "conditional",
        "beta": 0.01,
        "norm_bound": bound,
    }
    assert (
        RingQuantization.from_signed(signed).sensitivity(0.5, 5)
        == bound
        < 0.5 + StochasticQuantizer(6, c).step * 8**0.5
    )
    assert type(spec).from_dict(spec.to_dict()).compression == spec.compression
    # unbiased rounding on request: no bound in the configuration, the worst case C + Δ√D as the sensitivity
    plain = _task("cq-u", compression={"kind": "quantize", "bits": 6, "rotate": True, "rounding": "unbiased"})
    u = plain.signed_config()["compression"]
    assert u["rounding"] == "unbiased" and "norm_bound" not in u and "beta" not in u
    assert plain.build_compression().sensitivity(0.5, 5) == pytest.approx(0.5 + StochasticQuantizer(6, c).step * 8**0.5)
    # a configuration signed before the rounding field existed means unbiased rounding
    legacy = {k: v for k, v in u.items() if k != "rounding"}
    assert RingQuantization.from_signed(legacy) == plain.build_compression()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"compression": {"kind": "topk", "k": 2}}, "data dependent"),
        ({"compression": {"kind": "count_sketch"}}, "not wired"),
        ({"compression": {"kind": "gzip"}}, "unknown compression"),
        ({"secagg": False}, "runs with secagg"),
        ({"noise": {"kind": "distributed_discrete_gaussian", "bits": 16}}, "data dependent|runs with secagg"),
        ({"compression": {"kind": "quantize", "bits": 40}}, "bits must be"),
        ({"compression": {"kind": "quantize", "rotate": "yes"}}, "rotate must be"),
        ({"compression": {"kind": "quantize", "level": 3}}, "unknown options"),
        ({"compression": {"kind": "quantize", "rounding": "nearest"}}, "rounding must be"),
        ({"compression": {"kind": "quantize", "beta": 1.5}}, "beta must be"),
        ({"compression": {"kind": "quantize", "beta": True}}, "beta must be"),
        ({"compression": {"kind": "quantize", "rounding": "unbiased", "beta": 0.1}}, "conditional rounding only"),
    ],
)
def test_combinations_that_do_not_compose_are_refused(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(FLError, match=match):
        _task("x", **kw)


def test_compressed_rounds_over_the_pipeline_release_the_decoded_sum(tmp_path: Path) -> None:
    spec = _task("cq-e")
    comp = spec.build_compression()
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
    assert comp.rounding == "conditional"
    sd = spec.noise_multiplier * comp.norm_bound  # σ·B: equal ε with the float path's σ·C
    assert sd == spec.noise_multiplier * comp.sensitivity(spec.clip_norm, 5)
    for rec in status["history"]:
        assert "failed" not in rec, rec
        assert rec["noise_stddev"] == pytest.approx(sd)
    assert {r for d in devices for r in d.quantized} == {0, 1}
    for d in devices:  # what each device masked: b-bit codes of its rotated update, padded to D = 8, ‖q‖ ≤ B
        assert all(q.shape == (8,) and int(q.max()) < 2**6 for q in d.quantized.values())
        assert all(np.linalg.norm(comp.quantizer.dequantize(q)) <= comp.norm_bound for q in d.quantized.values())
    assert sum(0 in d.quantized for d in devices) == 5


def test_ring_decoder_recovers_the_sum_of_clipped_updates() -> None:
    """The job's decoder on 5 devices' codes summed mod 2^ring_bits: Σ x within 5 standard errors. Each
    rotated coordinate's rounding error has variance ≤ Δ²/4 per device; the inverse rotation is orthogonal
    (Σ_j R_ji² = 1), so each decoded coordinate's error has variance ≤ n·Δ²/4."""
    rq = RingQuantization.for_task({"kind": "quantize", "bits": 4, "rotate": True, "rounding": "unbiased"}, 0.5, 6, 5)
    rng = np.random.default_rng(12)
    errs = []
    for trial in range(400):
        xs = rng.normal(scale=0.1, size=(5, 5))
        codes = np.stack([rq.encode(x, trial, rng) for x in xs]).astype(np.uint64)
        total = codes.sum(axis=0) % (1 << rq.ring_bits)
        errs.append(rq.decode_sum(total, 5, trial, 5) - xs.sum(axis=0))
    e = np.array(errs)
    bound = 5 * rq.quantizer.step**2 / 4
    assert np.all(np.abs(e.mean(axis=0)) <= 5 * math.sqrt(bound / len(e)))  # unbiased
    assert np.all(e.var(axis=0) <= bound * 1.2)  # within the variance bound (1.2: sampling slack at n = 400)
    # decoding with a wrong rotation seed is far off: the seed matters
    bad = rq.decode_sum(total, 5, 10**6, 5) - xs.sum(axis=0)
    assert np.abs(bad).max() > 3 * math.sqrt(bound)


def test_device_refuses_a_round_whose_compression_is_not_the_signed_one() -> None:
    from client_sdk.fl.device import FLDevice

    spec = _task("cq-r")
    signed = spec.signed_config()
    dev = FLDevice("http://127.0.0.1:9", "cq-r", "dev-0", np.zeros((1, 4)), np.zeros(1))
    view = {"task_config": {"config": signed}}
    good = {"rotation_seed": 3, **signed["compression"]}
    assert dev._signed_compression(view, {"compression": good}).ring_bits == 9
    with pytest.raises(FLError, match="not the one the signed"):
        dev._signed_compression(view, {})
    with pytest.raises(FLError, match="differ"):
        dev._signed_compression(view, {"compression": {**good, "ring_bits": 32}})
    # a server that asks for unbiased rounding, or a looser bound, than the signed configuration: refused
    with pytest.raises(FLError, match="differ"):
        dev._signed_compression(view, {"compression": {**good, "norm_bound": 2 * good["norm_bound"]}})
    unbiased = {k: v for k, v in good.items() if k not in ("beta", "norm_bound")}
    with pytest.raises(FLError, match="differ"):
        dev._signed_compression(view, {"compression": {**unbiased, "rounding": "unbiased"}})
    with pytest.raises(FLError, match="unusable"):
        bad = {**signed, "compression": {**signed["compression"], "beta": 2.0}}
        dev._signed_compression({"task_config": {"config": bad}}, {"compression": {**good, "beta": 2.0}})
    with pytest.raises(FLError, match="not the one the signed"):
        dev._signed_compression({"task_config": {"config": {**signed, "compression": None}}}, {"compression": good})
