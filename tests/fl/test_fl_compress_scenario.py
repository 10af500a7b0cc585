"""``ldp fl compress`` (issue 18): compressed uplink updates on the drift partition at equal ε."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from estimator.fl.aggregators import RoundContext
from ldp_cli.main import main
from ldp_core.fl.compress import DEFAULT_ROUNDING_BETA, CountSketch, StochasticQuantizer
from ldp_core.fl.ddg import padded_dimension
from ldp_core.fl.errors import FLError, ModelError
from ldp_core.fl.training import ClientUpdate
from simulator.scenarios.fl.compress import CompressedDPMean, SchemeSpec

KEYS = {
    "scheme",
    "kind",
    "uplink_bytes",
    "uplink_ratio",
    "rounding",
    "rejection_rate",
    "fallbacks",
    "sensitivity",
    "noise_stddev",
    "epsilon",
    "final_accuracy",
    "final_accuracy_per_seed",
    "accuracy_per_round",
}


def test_compress_cli_contract(capsys: pytest.CaptureFixture[str], tmp_path: os.PathLike[str]) -> None:
    plot = os.path.join(tmp_path, "c.png")
    assert main(["fl", "compress", "--rounds", "3", "--seeds", "0,1", "--json", "--plot", plot]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"] == "compress" and out["seeds"] == [0, 1] and out["plot"] == plot
    assert os.path.getsize(plot) > 0
    rows = {r["scheme"]: r for r in out["schemes"]}
    assert set(rows) == {
        "none",
        "quantize_b8",
        "quantize_b8_conditional",
        "quantize_b4",
        "quantize_b4_conditional",
        "rotate_quantize_b4",
        "rotate_quantize_b4_conditional",
        "count_sketch_3x32",
        "count_sketch_3x32_clipped_b8",
        "topk_k21",
    }
    d = out["num_params"]
    for r in rows.values():
        assert set(r) == KEYS
        assert r["epsilon"] == out["epsilon"]  # equal ε: σ is relative to each scheme's sensitivity
        assert len(r["final_accuracy_per_seed"]) == 2 and len(r["accuracy_per_round"]) == 3
        assert r["noise_stddev"] == pytest.approx(out["noise_multiplier"] * r["sensitivity"])
    assert rows["none"]["uplink_bytes"] == 4 * d and rows["none"]["sensitivity"] == out["clip_norm"]
    assert rows["quantize_b8"]["uplink_bytes"] == StochasticQuantizer(8, 2.0).payload_bytes(d)
    assert rows["count_sketch_3x32"]["uplink_bytes"] == 4 * 3 * 32
    # the task option's sketch: 96 cells of 8 bits, S = C + Δ√96 for any seed (against √(3·max bucket)·C)
    clipped = rows["count_sketch_3x32_clipped_b8"]
    assert clipped["uplink_bytes"] == 96 and clipped["rounding"] == "unbiased"
    assert clipped["sensitivity"] == pytest.approx(2.0 + (4.0 / 255) * np.sqrt(96))
    assert clipped["sensitivity"] < rows["count_sketch_3x32"]["sensitivity"]
    assert rows["topk_k21"]["uplink_bytes"] == 8 * 21
    # conditional rounding: S = B < C + Δ√d at the same payload; its draws are counted
    for name, length in (("quantize_b4", d), ("rotate_quantize_b4", padded_dimension(d))):
        u, c = rows[name], rows[f"{name}_conditional"]
        assert u["rounding"] == "unbiased" and c["rounding"] == "conditional"
        assert u["rejection_rate"] is None and u["fallbacks"] is None
        assert c["uplink_bytes"] == u["uplink_bytes"]
        q = StochasticQuantizer(4, 2.0 if name == "quantize_b4" else 4 * 2.0 / np.sqrt(length))
        assert c["sensitivity"] == pytest.approx(q.conditional_bound(2.0, length, DEFAULT_ROUNDING_BETA))
        assert c["sensitivity"] < u["sensitivity"] == pytest.approx(q.norm_bound(2.0, length))
        assert 0.0 <= c["rejection_rate"] <= DEFAULT_ROUNDING_BETA and c["fallbacks"] == 0
    assert rows["none"]["rounding"] is None


def test_compress_cli_refuses_bad_seeds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fl", "compress", "--seeds", "0,-1", "--json"])
    assert "seeds" in capsys.readouterr().err


def test_compressed_dp_mean_is_unbiased_for_the_count_sketch_before_noise() -> None:
    # E over the hashes of the decoded mean is the mean of the clipped updates; noise σ = 0 isolates the sketch
    d, m, trials = 30, 5, 3000
    rng = np.random.default_rng(4)
    xs = rng.normal(scale=0.2, size=(m, d))
    ups = [ClientUpdate(f"c{i}", 1, xs[i].astype(np.float32), 1) for i in range(m)]
    target = xs.astype(np.float32).astype(np.float64).sum(axis=0) / m
    est = np.array(
        [
            CompressedDPMean(SchemeSpec("count_sketch", rows=2, cols=8), d, 10.0, 0.0, s)
            .aggregate(ups, RoundContext(1, d, np.random.default_rng(s), float(m)))
            .delta
            for s in range(trials)
        ]
    )
    # variance of the row-mean decoder of the summed sketch: Σ_{j≠i} X_j²/(rows·cols), X the sum, over m²
    tot = target * m
    var = (np.sum(tot**2) - tot**2) / (2 * 8) / m**2
    assert np.all(np.abs(est.mean(axis=0) - target) <= 5 * np.sqrt(var / trials))


def test_compressed_dp_mean_conditional_rounding_keeps_every_code_within_s() -> None:
    # σ = 0 and m = 1: the released sum is the one device's dequantized codes, so its norm is ‖q‖ ≤ S = B
    d = 210
    for kind in ("quantize", "rotate_quantize"):
        agg = CompressedDPMean(SchemeSpec(kind, bits=4, rounding="conditional", beta=0.5), d, 2.0, 0.0, 3)
        rng = np.random.default_rng(8)
        for _ in range(200):
            x = rng.normal(size=d)
            x *= 2.0 / np.linalg.norm(x)  # at the clip boundary
            total = agg._encode("c", x, rng)
            assert np.linalg.norm(total) <= agg.sensitivity
        assert agg.encodings == 200 and agg.fallbacks == 0


def test_compressed_dp_mean_refuses_bad_schemes() -> None:
    with pytest.raises(FLError, match="rounding"):
        CompressedDPMean(SchemeSpec("quantize", rounding="nearest"), 10, 1.0, 1.0, 0)
    with pytest.raises(ModelError, match="unknown compression"):
        CompressedDPMean(SchemeSpec("gzip"), 10, 1.0, 1.0, 0)
    with pytest.raises(ModelError):
        CountSketch(10, 0, 8, 0)
