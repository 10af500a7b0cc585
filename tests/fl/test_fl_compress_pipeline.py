"""Compressed updates as a task option (issue 18): ``"compression": {"kind": "quantize", ...}`` under SecAgg
through the real devices → collector → job path, and the refusals of what does not compose."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk.fl.device import FLDevice
from ldp_core.fl.compress import RingQuantization, StochasticQuantizer
from ldp_core.fl.errors import FLError
from ldp_core.fl.protocol import BINARY_CONTENT_TYPE, encode_upload_binary, make_upload, parse_upload, sign_upload
from ldp_core.wire.framing import unpack_headed
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
        ({"compression": {"kind": "rotate_quantize"}}, "not wired"),
        ({"compression": {"kind": "count_sketch", "rows": 3, "cols": 2}}, "do not compress"),
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


def _masked_bodies(dev: FLDevice, sent: list[bytes], tamper: Callable[[FLDevice, bytes, Any], Any] | None) -> None:
    """Record the HTTP bodies of ``dev``'s masked uploads; before the first, let ``tamper`` send a forged one."""
    real = dev._request

    def request(method: str, url: str, body: bytes | None = None, *a: Any, **kw: Any) -> Any:
        if body is not None and body[:4] == b"LDPU":
            head, _ = unpack_headed(body, b"LDPU", "upload")
            if json.loads(head)["kind"] == "masked":
                if tamper is not None and not sent:
                    tamper(dev, body, real)
                sent.append(body)
        return real(method, url, body, *a, **kw)

    dev._request = request  # type: ignore[method-assign]


def test_compressed_rounds_over_the_pipeline_release_the_decoded_sum(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import estimator.fl.secagg_server as sas

    configs: list[int] = []  # one neighbour graph per round: the job draws the SecAgg randomness once
    real_make_config = sas.make_config
    monkeypatch.setattr(sas, "make_config", lambda *a, **kw: configs.append(1) or real_make_config(*a, **kw))
    spec = _task("cq-e")
    comp = spec.build_compression()
    assert comp is not None
    data = make_data(6)
    topics = Topics.fresh()
    url = f"sqlite:///{tmp_path / 'log.sqlite3'}"
    refused: list[tuple[str, int, str]] = []

    def forge(how: str) -> Callable[[FLDevice, bytes, Any], None]:
        """A device's own signed masked input in another form, posted before its real one: refused by the
        collector, and the round still gets every real input (nothing else of the batch is lost)."""

        def send(dev: FLDevice, body: bytes, post: Any) -> None:
            u = parse_upload(body, payload_size=5)
            if how == "truncated":
                bad = body[:-1]
            else:
                payload = {"vector": u.payload["vector"]} if how == "uint32" else {**u.payload, "ring_bits": 10}
                forged = sign_upload(make_upload(u.task, u.round, "masked", u.client_id, payload), dev.identity)
                bad = encode_upload_binary(forged)
            r = post("POST", f"{dev.base}/uploads", bad, BINARY_CONTENT_TYPE)
            refused.append((how, r.status, r.body.get("error") if isinstance(r.body, dict) else None))

        return send

    sent: dict[str, list[bytes]] = {}
    with (
        open_transport(url) as tr,
        collector(tmp_path, url, topics) as srv,
        JobThread(tr, spec, topics, checkpoint_interval=0.2) as jt,
    ):
        devices = devices_for(srv.url, spec, data)
        for d, how in zip(devices, ["uint32", "wider", "truncated", None, None, None]):
            _masked_bodies(d, sent.setdefault(d.client_id, []), None if how is None else forge(how))
        drive(devices, jt.finished, timeout=90)
        status = jt.result
    assert status is not None and len(status["history"]) == 2, status
    assert len(configs) == 2
    assert comp.rounding == "conditional"
    sd = spec.noise_multiplier * comp.norm_bound  # σ·B: equal ε with the float path's σ·C
    assert sd == spec.noise_multiplier * comp.sensitivity(spec.clip_norm, 5)
    for rec in status["history"]:
        assert "failed" not in rec, rec
        assert rec["noise_stddev"] == pytest.approx(sd)
    # every sampled device's real masked input was taken, forged ones or not: 5 survivors in each round
    assert [len(rec["secagg_survivors"]) for rec in status["history"]] == [5, 5]
    forged = {how: (code, err) for how, code, err in refused}
    assert forged == {"uint32": (422, "bad_secagg"), "wider": (422, "bad_secagg"), "truncated": (422, "wrong_shape")}
    # the bytes each device sent: framing 10 (magic 4, version 1, reserved 1, header length 4) + header +
    # ⌈D·r/8⌉ = ⌈8·9/8⌉ = 9 packed bytes (uint32 words would be 4·D = 32)
    bodies = [b for per in sent.values() for b in per]
    assert len(bodies) == 10
    for b in bodies:
        head, raw = unpack_headed(b, b"LDPU", "upload")
        assert json.loads(head)["payload"] == {"ring_bits": 9, "length": 8}
        assert len(b) == 10 + len(head) + comp.payload_bytes(5) and comp.payload_bytes(5) == 9 == len(raw)
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
