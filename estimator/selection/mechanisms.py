"""Selection mechanisms over candidates with private integer scores, and what each costs.

A *score* here is an integer count computed on private data, e.g. how many of the validation rows a
candidate model classifies correctly. Under add/remove neighbours one person moves every score by at most
Δ (``sensitivity``; Δ = 1 for a count of correct rows), and a count of correct rows is *monotone*: adding
a person raises every candidate's score or leaves it, removing one lowers it or leaves it (never one up
and another down). Under replace-one neighbours counts are not monotone.

Sparse vector technique (:class:`AboveThreshold`, :func:`svt_select`)
    Lyu, Su and Li, "Understanding the Sparse Vector Technique for Differential Privacy" (VLDB 2017),
    Alg. 1: a noisy threshold T + ρ, ρ ~ Lap(Δ/ε₁), drawn once; each query q_i is answered ⊤ if
    q_i + ν_i >= T + ρ, with fresh ν_i ~ Lap(2cΔ/ε₂) (Lap(cΔ/ε₂) for monotone queries), and the
    run *halts* after c ⊤ answers. Any number of ⊥ answers is free; the whole run is (ε₁ + ε₂)-DP.
    Why these scales (the proof of Lyu et al., Thm. 2, in short): fix an output with at most c ⊤ and
    map each noise vector for D to one for the neighbour D' that gives the same output.

    * General queries (|q'_i − q_i| <= Δ in either direction): put ρ' = ρ + Δ. Every ⊥ stays ⊥ for free
      (q'_i + ν_i <= q_i + Δ + ν_i < T + ρ + Δ). Every ⊤ needs ν'_i = ν_i + 2Δ (the threshold rose by Δ and
      the query may have fallen by Δ). The density ratio is e^{Δ/b₁} · e^{2Δ/b₂ · c} = e^{ε₁ + ε₂} with
      b₁ = Δ/ε₁, b₂ = 2cΔ/ε₂.
    * Monotone queries: if they all rise (q' >= q), ρ' = ρ + Δ and ν'_i = ν_i + Δ for the ⊤; if they all
      fall, ρ' = ρ costs nothing and the ⊤ need ν'_i = ν_i + Δ. So b₂ = cΔ/ε₂ suffices.

    With ε₁ = ε₂ = ε/2 and c = 1 these are Dwork and Roth's AboveThreshold scales (2Δ/ε for the
    threshold, 4Δ/ε for the queries). The split used here is the one Lyu et al. recommend (Sec. 4.2),
    ε₁ : ε₂ = 1 : (2c)^{2/3} (1 : c^{2/3} monotone), from :class:`estimator.accounting.central.SparseVector`,
    whose scales, discrete (integer) Laplace noise and OS-CSPRNG default this module reuses. Only ⊤/⊥
    is released, never a noisy score (releasing q_i + ν_i is Roth's 2011 variant, which is not private).
    The known-broken variants (no query noise, Stoddard et al. 2014; not halting after c, Chen et al.
    2015; query noise not scaled with c, Lee and Clifton 2014) are each ∞- or (>ε)-DP; the test suite
    implements one and catches it with an empirical audit.

Exponential mechanism (:func:`exponential_mechanism`)
    McSherry and Talwar 2007: pick candidate i with probability ∝ exp(ε u_i / (2Δ)) (∝ exp(ε u_i / Δ) for
    monotone scores), which is ε-DP. It is sampled exactly as report-noisy-max with Gumbel noise of scale
    2Δ/ε (Δ/ε), the Gumbel-max identity (Durfee and Rogers 2019 call it one-shot top-1). Its ε does not
    grow with the number of candidates; its accuracy does (by about (2Δ/ε) ln k).

Naive approach (:func:`naive_cost`)
    Release every candidate's score with Laplace noise and take the best: k releases of ε_i = Δ/b each,
    composed: kΔ/b by basic composition, or the PLD composition at δ (``dp_accounting``). This is the
    cost the two mechanisms above avoid.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.accounting.accountant import account
from estimator.accounting.central import SparseVector
from estimator.errors import EstimatorError
from ldp_core.noise import discrete_laplace
from ldp_core.privacy_events import LaplaceEvent, PureDPEvent, SelfComposedEvent
from ldp_core.randomness import secure_generator

__all__ = [
    "SelectionError",
    "AboveThreshold",
    "SVTSelection",
    "svt_select",
    "exponential_mechanism",
    "exponential_probabilities",
    "naive_cost",
    "svt_report",
    "plot_selection_costs",
    "PROTECTS_SCORES",
]

PROTECTS_SCORES = (
    "one person's presence in the private data the candidates are scored on (add/remove), against anyone "
    "who sees which candidate was chosen"
)


class SelectionError(EstimatorError, ValueError):
    """Bad selection input, or a query after the sparse vector technique halted."""


def _integer(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise SelectionError(f"{name} must be an integer count (the noise proof needs integers), got {v!r}")
    return int(v)


def _above(scores: np.ndarray, nu: np.ndarray, rho: np.ndarray, threshold: float) -> np.ndarray:
    """The comparison q + ν >= T + ρ (the one place it is written; ρ broadcast per run)."""
    return np.asarray(scores + nu - rho >= threshold)


class AboveThreshold:
    """The sparse vector technique, one query at a time (module docstring): :meth:`test` answers
    whether the next integer score is above the noisy threshold, and refuses after ``svt.max_answers``
    ⊤ answers (the halting the privacy proof needs). ``rng`` defaults to the OS CSPRNG."""

    def __init__(self, svt: SparseVector, rng: np.random.Generator | None = None) -> None:
        self.svt = svt
        self._rng = secure_generator() if rng is None else rng
        b1, self._b2 = svt.scales
        self._rho = int(discrete_laplace(b1, 1, self._rng)[0])
        self.answers: list[bool] = []

    @classmethod
    def resumed(
        cls, svt: SparseVector, state: dict[str, Any], rng: np.random.Generator | None = None
    ) -> AboveThreshold:
        """The run :meth:`state` saved: its noisy threshold and the answers it already gave, so that a
        restarted search goes on with the same ρ and never asks an answered query again (asking again would be
        a new release that its ε does not cover)."""
        run = cls.__new__(cls)
        run.svt = svt
        run._rng = secure_generator() if rng is None else rng
        run._b2 = svt.scales[1]
        run._rho = _integer("rho", state["rho"])
        run.answers = [bool(a) for a in state["answers"]]
        return run

    def state(self) -> dict[str, Any]:
        """What :meth:`resumed` needs: the noisy threshold's offset ρ (keep it secret) and the answers so far."""
        return {"rho": self._rho, "answers": list(self.answers)}

    @property
    def positives(self) -> int:
        return sum(self.answers)

    @property
    def halted(self) -> bool:
        return self.positives >= self.svt.max_answers

    @property
    def event(self) -> PureDPEvent:
        """ε₁ + ε₂ whatever the number of queries asked."""
        return self.svt.event

    def test(self, score: int) -> bool:
        if self.halted:
            raise SelectionError(
                f"the sparse vector technique halted after {self.svt.max_answers} above-threshold answer(s); "
                "its ε covers no further query (start a new run and pay for it)"
            )
        q = _integer("score", score)
        nu = discrete_laplace(self._b2, 1, self._rng)
        above = bool(_above(np.array([q]), nu, np.array([self._rho]), self.svt.threshold)[0])
        self.answers.append(above)
        return above

    @staticmethod
    def outcomes(svt: SparseVector, scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Many independent runs at once, for audits and simulations: row r of the integer array
        ``scores`` is run r's query sequence. Returns, per run and query, 1 (⊤), 0 (⊥) or -1 (not asked:
        the run had halted). Same noise scales, comparison and halting as :meth:`test`."""
        q = np.asarray(scores)
        if q.ndim != 2 or not np.issubdtype(q.dtype, np.integer):
            raise SelectionError(f"scores must be a 2-D integer array (runs × queries), got {q.dtype} {q.shape}")
        b1, b2 = svt.scales
        rho = discrete_laplace(b1, q.shape[0], rng)
        nu = discrete_laplace(b2, q.size, rng).reshape(q.shape)
        above = _above(q, nu, rho[:, None], svt.threshold)
        before = np.cumsum(above, axis=1) - above  # ⊤ answers before each query
        out = np.where(above, 1, 0)
        out[before >= svt.max_answers] = -1
        return out


@dataclasses.dataclass(frozen=True)
class SVTSelection:
    """Which candidates were found above the threshold (in order), how many were scored, at what cost."""

    selected: tuple[int, ...]
    scored: int
    answers: tuple[bool, ...]
    epsilon: float

    @property
    def index(self) -> int | None:
        """The first candidate above the threshold, or None."""
        return self.selected[0] if self.selected else None


def svt_select(
    score: Callable[[int], int], candidates: int, svt: SparseVector, rng: np.random.Generator | None = None
) -> SVTSelection:
    """Score candidates 0, 1, ... one at a time with ``score(i)`` (computed only when asked: a candidate
    after the halt is never scored) until ``svt.max_answers`` of them test above the threshold."""
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise SelectionError(f"candidates must be a positive integer, got {candidates!r}")
    run = AboveThreshold(svt, rng)
    selected = []
    for i in range(candidates):
        if run.test(score(i)):
            selected.append(i)
            if run.halted:
                break
    return SVTSelection(tuple(selected), len(run.answers), tuple(run.answers), svt.epsilon)


def _utility_scale(epsilon: float, sensitivity: float, monotonic: bool) -> float:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise SelectionError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise SelectionError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    return epsilon / ((1.0 if monotonic else 2.0) * sensitivity)


def _scores(scores: Sequence[float]) -> np.ndarray:
    u = np.asarray(scores, dtype=np.float64)
    if u.ndim != 1 or u.size == 0 or not np.isfinite(u).all():
        raise SelectionError("scores must be a non-empty list of finite numbers")
    return u


def exponential_probabilities(
    scores: Sequence[float], epsilon: float, sensitivity: float = 1.0, monotonic: bool = False
) -> np.ndarray:
    """The exponential mechanism's selection probabilities (softmax of ε u / (2Δ), or ε u / Δ monotone)."""
    z = _scores(scores) * _utility_scale(epsilon, sensitivity, monotonic)
    w = np.exp(z - z.max())
    return np.asarray(w / w.sum())


def exponential_mechanism(
    scores: Sequence[float],
    epsilon: float,
    sensitivity: float = 1.0,
    monotonic: bool = False,
    rng: np.random.Generator | None = None,
) -> int:
    """One candidate index by the exponential mechanism, sampled as report-noisy-max with Gumbel noise
    (module docstring); ε-DP whatever the number of candidates. ``rng`` defaults to the OS CSPRNG."""
    z = _scores(scores) * _utility_scale(epsilon, sensitivity, monotonic)
    r = secure_generator() if rng is None else rng
    return int(np.argmax(z + r.gumbel(size=z.size)))


def naive_cost(candidates: int, noise_scale: float, delta: float, sensitivity: float = 1.0) -> dict[str, Any]:
    """ε of releasing ``candidates`` scores each with Laplace noise of scale ``noise_scale`` (module
    docstring): basic composition and the PLD composition at ``delta``."""
    if isinstance(candidates, bool) or not isinstance(candidates, int) or candidates < 1:
        raise SelectionError(f"candidates must be a positive integer, got {candidates!r}")
    each = sensitivity / noise_scale
    report = account(SelfComposedEvent(LaplaceEvent(noise_scale / sensitivity), candidates), delta)
    return {
        "candidates": candidates,
        "noise_scale": noise_scale,
        "epsilon_each": each,
        "epsilon_basic": candidates * each,
        "epsilon_pld": report.epsilon_pld,
        "delta": delta,
    }


def svt_report(
    epsilon: float,
    candidates: int,
    delta: float,
    max_answers: int = 1,
    sensitivity: int = 1,
    monotonic: bool = False,
    threshold: float = 0.0,
) -> dict[str, Any]:
    """What ``ldp privacy svt --json`` prints: the SVT's ε and its noise scales, beside the exponential
    mechanism's ε and the naive approach's cost over the same candidates at the SVT's query noise."""
    svt = SparseVector(epsilon, threshold, max_answers, sensitivity, monotonic)
    e1, e2 = svt.epsilon_split
    b1, b2 = svt.scales
    naive = naive_cost(candidates, float(b2), delta, float(sensitivity))
    return {
        "epsilon": svt.epsilon,
        "epsilon_threshold": e1,
        "epsilon_queries": e2,
        "threshold_scale": float(b1),
        "query_scale": float(b2),
        "threshold_noise": "Lap(Δ/ε₁)",
        "query_noise": "Lap(cΔ/ε₂)" if monotonic else "Lap(2cΔ/ε₂)",
        "max_answers": svt.max_answers,
        "sensitivity": svt.sensitivity,
        "monotonic": monotonic,
        "candidates": candidates,
        "epsilon_exponential_mechanism": svt.epsilon,
        "naive": naive,
        "delta": delta,
        "neighbors": "add_or_remove",
        "protects": PROTECTS_SCORES,
    }


def plot_selection_costs(report: dict[str, Any], path: str) -> None:
    """ε against the number of candidates for the report's SVT, the exponential mechanism and the naive
    approach at the SVT's query noise (basic composition and PLD at the report's δ)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(int(report["candidates"]), 2)
    ks = sorted({int(round(k)) for k in np.geomspace(1, top, min(top, 12))})
    naive = [naive_cost(k, report["query_scale"], report["delta"], float(report["sensitivity"])) for k in ks]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(ks, [report["epsilon"]] * len(ks), label="sparse vector technique")
    ax.plot(ks, [report["epsilon_exponential_mechanism"]] * len(ks), "--", label="exponential mechanism")
    ax.plot(ks, [n["epsilon_basic"] for n in naive], marker="o", label="naive, basic composition")
    ax.plot(ks, [n["epsilon_pld"] for n in naive], marker="s", label=f"naive, PLD (δ = {report['delta']:g})")
    ax.set_xlabel("candidates")
    ax.set_ylabel("ε")
    ax.set_title("Private selection: what choosing among candidates costs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
