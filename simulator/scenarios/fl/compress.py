"""Compressed uplink updates on the drift scenario at equal ε (issue 18, "Compressed updates").

Every scheme runs DP-FedAvg on the drift scenario's skewed partition (:mod:`simulator.scenarios.fl.drift`)
with the same data, schedule and training seed. Each sampled device clips its update to C, then encodes
it (:mod:`ldp_core.fl.compress`); the server decodes, sums, adds Gaussian noise N(0, (σ·S)²) with S the
scheme's L2 sensitivity *in the domain where the noise is added*, and divides by the expected count m:

* ``none``: float32, S = C;
* ``quantize``: b-bit stochastic rounding with public coordinate bound c = C; with ``rounding="unbiased"``
  S = C + Δ·√d (:meth:`StochasticQuantizer.norm_bound`: rounding is not norm preserving), with
  ``rounding="conditional"`` (the ``_conditional`` schemes) the rounding is redrawn until ‖q‖ ≤ B and
  S = B (:meth:`StochasticQuantizer.conditional_bound` at β = ``beta``);
* ``rotate_quantize``: the public rotation, then b bits with c = 4C/√D, noise in the rotated domain
  (S = C + Δ·√D, or B over the D rotated coordinates), then the inverse rotation (post-processing);
* ``count_sketch``: rows × cols cells, noise on the summed sketch with S = √(rows · max bucket)·C
  (:meth:`CountSketch.norm_bound`), then the unbiased row-mean decoder; with ``clipped`` (the
  ``_clipped_b{bits}`` schemes) the task option's encoder instead
  (:class:`ldp_core.fl.ring_sketch.RingCountSketch`): the sketch scaled by 1/√rows, clipped to C and
  rounded to b bits, S = C + Δ·√(rows·cols) for any hash seed;
* ``topk``: top-k with error feedback, the *sent* vector clipped to C after the selection (S = C),
  central noise only (:func:`check_composition` refuses it with SecAgg or distributed noise).

The noise multiplier σ is the same for all, relative to each scheme's S, so the accountant's ε is equal
(replace-one neighbours, fixed-count sampling, the figure against whoever knows the sample). Which
schemes pay for their compression in accuracy, and how much, is what this measures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.fl.aggregators import AggregateResult, RoundContext
from estimator.fl.dp import ClientLevelAccountant
from estimator.fl.sampling import FixedCountSampling
from estimator.fl.strategies import FedAvg
from ldp_core.fl.compress import (
    DEFAULT_ROUNDING_BETA,
    MAX_ROUNDING_DRAWS,
    ROUNDINGS,
    CountSketch,
    RotatedQuantizer,
    StochasticQuantizer,
    TopKErrorFeedback,
    check_composition,
    dense_bytes,
)
from ldp_core.fl.ddg import padded_dimension
from ldp_core.fl.errors import FLError
from ldp_core.fl.models import SoftmaxRegression
from ldp_core.fl.ring_sketch import RingCountSketch
from ldp_core.fl.training import ClientUpdate, clip_to_norm
from simulator.rounds import RoundRecord
from simulator.scenarios.fl.drift import DriftConfig, DriftDPConfig, ScheduledSampling, _run, make_drift_data

__all__ = ["CompressedDPMean", "SchemeSpec", "DEFAULT_SCHEMES", "run_compress", "plot_compress", "report_lines"]


@dataclasses.dataclass(frozen=True)
class SchemeSpec:
    """One uplink encoding: ``kind`` (none, quantize, rotate_quantize, count_sketch, topk) and its parameters."""

    kind: str
    bits: int = 8
    rows: int = 3
    cols: int = 32
    k: int = 21
    rounding: str = "unbiased"
    beta: float = DEFAULT_ROUNDING_BETA
    #: count_sketch only: clip the scaled sketch and quantize its cells (the task option's encoder)
    clipped: bool = False

    @property
    def name(self) -> str:
        if self.kind in ("quantize", "rotate_quantize"):
            return f"{self.kind}_b{self.bits}" + ("_conditional" if self.rounding == "conditional" else "")
        if self.kind == "count_sketch":
            return f"count_sketch_{self.rows}x{self.cols}" + (f"_clipped_b{self.bits}" if self.clipped else "")
        if self.kind == "topk":
            return f"topk_k{self.k}"
        return self.kind


DEFAULT_SCHEMES: tuple[SchemeSpec, ...] = (
    SchemeSpec("none"),
    SchemeSpec("quantize", bits=8),
    SchemeSpec("quantize", bits=8, rounding="conditional"),
    SchemeSpec("quantize", bits=4),
    SchemeSpec("quantize", bits=4, rounding="conditional"),
    SchemeSpec("rotate_quantize", bits=4),
    SchemeSpec("rotate_quantize", bits=4, rounding="conditional"),
    SchemeSpec("count_sketch", rows=3, cols=32),
    SchemeSpec("count_sketch", rows=3, cols=32, bits=8, clipped=True),
    SchemeSpec("topk", k=21),
)


class CompressedDPMean:
    """Encode each clipped update as its device would, decode on the server, add N(0, (σ·S)²) where the
    scheme sums, divide by m. ``ctx.rng`` draws the rounding and the noise (a simulation; devices round
    with a CSPRNG). Top-k keeps one error-feedback residual per client id across rounds."""

    linear = False

    def __init__(self, scheme: SchemeSpec, dim: int, clip_norm: float, noise_multiplier: float, seed: int) -> None:
        check_composition(scheme.kind, secagg=False, distributed_noise=False)
        self.scheme, self.dim, self.C, self.sigma = scheme, dim, float(clip_norm), float(noise_multiplier)
        D = padded_dimension(dim)
        self.quantizer: StochasticQuantizer | None = None
        self.rotated: RotatedQuantizer | None = None
        self.sketch: CountSketch | None = None
        self.ring_sketch: RingCountSketch | None = None
        self.seed = seed
        self.residuals: dict[str, TopKErrorFeedback] = {}
        if scheme.rounding not in ROUNDINGS:
            raise FLError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {scheme.rounding!r}")
        self.conditional = scheme.kind in ("quantize", "rotate_quantize") and scheme.rounding == "conditional"
        #: conditional rounding's draws: encodings, rejected draws, fallbacks (the redraw rate it needed)
        self.encodings = self.rejected_draws = self.fallbacks = 0
        if scheme.kind == "quantize":
            self.quantizer = StochasticQuantizer(scheme.bits, self.C)
            self.sensitivity = self._quantized_bound(dim)
            self.bytes = self.quantizer.payload_bytes(dim)
        elif scheme.kind == "rotate_quantize":
            self.quantizer = StochasticQuantizer(scheme.bits, 4.0 * self.C / math.sqrt(D))
            self.rotated = RotatedQuantizer(self.quantizer, seed)
            self.sensitivity = self._quantized_bound(D)
            self.bytes = self.rotated.payload_bytes(dim)
        elif scheme.kind == "count_sketch" and scheme.clipped:
            # ring_bits is the task option's (unused here: the simulation sums dequantized cells)
            rcs = RingCountSketch(scheme.rows, scheme.cols, scheme.bits, self.C, scheme.bits + 1)
            self.ring_sketch = rcs
            self.sensitivity = rcs.sensitivity(self.C, dim)
            self.bytes = rcs.quantizer.payload_bytes(rcs.length(dim))
        elif scheme.kind == "count_sketch":
            self.sketch = CountSketch(dim, scheme.rows, scheme.cols, seed)
            self.sensitivity = self.sketch.norm_bound(self.C)
            self.bytes = self.sketch.payload_bytes()
        elif scheme.kind == "topk":
            if not 1 <= scheme.k <= dim:
                raise FLError(f"topk: k must be in [1, {dim}], got {scheme.k}")
            self.sensitivity = self.C
            self.bytes = 8 * scheme.k
        else:
            self.sensitivity = self.C
            self.bytes = dense_bytes(dim)

    def _quantized_bound(self, length: int) -> float:
        assert self.quantizer is not None
        if self.conditional:
            return self.quantizer.conditional_bound(self.C, length, self.scheme.beta)
        return self.quantizer.norm_bound(self.C, length)

    def _round(self, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Dequantized codes of y (already rotated for ``rotate_quantize``), conditionally rounded to ‖q‖ ≤ S
        when the scheme says so."""
        assert self.quantizer is not None
        if not self.conditional:
            return self.quantizer.dequantize(self.quantizer.quantize(y, rng))
        codes, draws = self.quantizer.quantize_conditional(y, rng, self.sensitivity)
        self.encodings += 1
        self.rejected_draws += draws - 1
        self.fallbacks += draws > MAX_ROUNDING_DRAWS
        return self.quantizer.dequantize(codes)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        total: np.ndarray | None = None
        for u in updates:
            x, _ = clip_to_norm(np.asarray(u.delta, dtype=np.float64), self.C)
            enc = self._encode(u.client_id, np.asarray(x, dtype=np.float64), ctx.rng)
            total = enc if total is None else total + enc
        assert total is not None
        noisy = total + ctx.rng.normal(scale=self.sigma * self.sensitivity, size=total.shape)
        mean = self._decode(noisy) / ctx.expected_clients
        info = {
            "sensitivity": self.sensitivity,
            "noise_stddev": self.sigma * self.sensitivity,
            "uplink_bytes": self.bytes,
        }
        return AggregateResult(mean, ctx.expected_clients, len(updates), info)

    def _encode(self, client_id: str, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The update in the domain where the server sums it (decoded codes, the sketch, or the sparse vector)."""
        kind = self.scheme.kind
        if kind == "quantize":
            return self._round(x, rng)
        if kind == "rotate_quantize":
            assert self.rotated is not None
            return self._round(self.rotated.rotated(x), rng)
        if kind == "count_sketch" and self.ring_sketch is not None:
            rcs = self.ring_sketch
            return rcs.quantizer.dequantize(rcs.encode(x, self.seed, rng))
        if kind == "count_sketch":
            assert self.sketch is not None
            return self.sketch.sketch(x)
        if kind == "topk":
            ef = self.residuals.setdefault(client_id, TopKErrorFeedback(self.dim, self.scheme.k))
            sent, _ = clip_to_norm(ef.step(x).dense(), self.C)  # clip after the selection (check_composition)
            return np.asarray(sent, dtype=np.float64)
        return x.astype(np.float32).astype(np.float64)

    def _decode(self, total: np.ndarray) -> np.ndarray:
        if self.rotated is not None:
            return self.rotated.unrotate(total, self.dim)
        if self.sketch is not None:
            return self.sketch.unsketch(total)
        if self.ring_sketch is not None:
            return self.ring_sketch.unsketch(total, self.seed, self.dim)
        return total


def run_compress(
    cfg: DriftConfig | None = None,
    dp: DriftDPConfig | None = None,
    schemes: Sequence[SchemeSpec] = DEFAULT_SCHEMES,
    seeds: Sequence[int] = (0,),
    on_round: Callable[[RoundRecord], None] | None = None,
) -> dict[str, Any]:
    """Per scheme: uplink bytes per device and round, final accuracy per seed and their mean, and ε.
    ``on_round`` is called after every round of every scheme and seed (progress display; draws nothing)."""
    cfg = DriftConfig() if cfg is None else cfg
    dp = DriftDPConfig() if dp is None else dp
    n, m = cfg.clients, cfg.clients_per_round
    dim = SoftmaxRegression(cfg.features, cfg.classes).num_params
    acc = ClientLevelAccountant(FixedCountSampling(m), n, dp.delta)
    for _ in range(cfg.rounds):
        acc.record(dp.noise_multiplier)
    eps = acc.epsilon_known_sample()
    rows: list[dict[str, Any]] = []
    for s in schemes:
        finals: list[float] = []
        per_round: list[list[float]] = []
        agg = None
        encodings = rejected = fallbacks = 0
        for seed in seeds:
            c = dataclasses.replace(cfg, seed=seed)
            skewed, _, test = make_drift_data(c, np.random.default_rng([seed, 0]))
            schedule = ScheduledSampling.draw(n, m, c.rounds, np.random.default_rng([seed, 1]))
            agg = CompressedDPMean(s, dim, dp.clip_norm, dp.noise_multiplier, seed)
            run = _run(s.name, FedAvg(c.training), skewed, c, schedule, test, agg, on_round=on_round)
            finals.append(run["final_accuracy"])
            per_round.append(run["accuracy_per_round"])
            encodings, rejected, fallbacks = (
                encodings + agg.encodings,
                rejected + agg.rejected_draws,
                fallbacks + agg.fallbacks,
            )
        assert agg is not None
        quantized = s.kind in ("quantize", "rotate_quantize") or (s.kind == "count_sketch" and s.clipped)
        rows.append(
            {
                "scheme": s.name,
                "kind": s.kind,
                "uplink_bytes": agg.bytes,
                "uplink_ratio": agg.bytes / dense_bytes(dim),
                "rounding": s.rounding if quantized else None,
                # conditional rounding: the share of rounding draws rejected (‖q‖ > S), and the fallbacks
                "rejection_rate": rejected / (encodings + rejected) if agg.conditional and encodings else None,
                "fallbacks": fallbacks if agg.conditional else None,
                "sensitivity": agg.sensitivity,
                "noise_stddev": dp.noise_multiplier * agg.sensitivity,
                "epsilon": eps,
                "final_accuracy": float(np.mean(finals)),
                "final_accuracy_per_seed": finals,
                "accuracy_per_round": [float(v) for v in np.mean(per_round, axis=0)],
            }
        )
    return {
        "scenario": "compress",
        "seeds": list(seeds),
        "rounds": cfg.rounds,
        "clients": n,
        "clients_per_round": m,
        "num_params": dim,
        "clip_norm": dp.clip_norm,
        "noise_multiplier": dp.noise_multiplier,
        "delta": dp.delta,
        "epsilon": eps,
        "epsilon_against": "whoever knows the sample (replace-one neighbours, fixed-count sampling)",
        "schemes": rows,
    }


def plot_compress(result: dict[str, Any], path: str) -> None:
    """Final accuracy against uplink bytes per device and round, one point per scheme (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for r in result["schemes"]:
        ax.scatter(r["uplink_bytes"], r["final_accuracy"])
        ax.annotate(r["scheme"], (r["uplink_bytes"], r["final_accuracy"]), fontsize=7)
        bx.plot(range(1, len(r["accuracy_per_round"]) + 1), r["accuracy_per_round"], label=r["scheme"])
    from simulator.plots import finish_axes, save_figure

    ax.set_xscale("log")
    title = f"drift, DP-FedAvg at ε = {result['epsilon']:.2f}, δ = {result['delta']:g}"
    finish_axes(ax, "uplink bytes per device and round", "final test accuracy (mean over seeds)", title, legend=None)
    finish_axes(bx, "round", "test accuracy", legend=7)
    save_figure(fig, path)


def report_lines(result: dict[str, Any]) -> list[str]:
    """What ``ldp study compress`` prints for :func:`run_compress`'s ``result``: each scheme's uplink bytes,
    sensitivity and final accuracy at the common ε."""
    lines = [
        f"compress: drift partition, {result['rounds']} rounds, seeds {result['seeds']}, "
        f"ε = {result['epsilon']:.2f} (δ = {result['delta']:g}; {result['epsilon_against']}) for every scheme"
    ]
    for r in result["schemes"]:
        lines.append(
            f"  {r['scheme']:<22} {r['uplink_bytes']:>5} B  sensitivity {r['sensitivity']:.2f}  accuracy {r['final_accuracy']:.3f}"
        )
    return lines
