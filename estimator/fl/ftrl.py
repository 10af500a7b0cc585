"""DP-FTRL: client-level DP without a secret sample (Kairouz, McMahan, Song, Thakkar, Thakurta, Xu,
"Practical and Private (Deep) Learning without Sampling or Shuffling", ICML 2021).

DP-FedAvg's ε against observers credits amplification by a *secret* sample; where the sample is
known (to the operator, to the selected devices, to anyone it leaks to) that credit is void. DP-FTRL
needs no sampling assumption. The server releases noisy *prefix sums* of the clipped updates,
S̃_t = Σ_{s≤t} Σᵢ clip(Δᵢˢ) + n_t, and the model is the FTRL iterate
w_t = w_0 + η S̃_t / m̄ (the FTRL form of SGD with a quadratic regulariser, ibid. Sec. 3; no momentum
here). The noise n_t comes from the binary-tree mechanism (Dwork, Naor, Pitassi, Rothblum, STOC 2010;
Chan, Shi, Song, TISSEC 2011): every dyadic interval [j·2ᵏ + 1, (j+1)·2ᵏ] of rounds is a tree node
with its own N(0, σ²C²·I); n_t is the sum of the nodes of t's binary decomposition, popcount(t) of
them, so its variance grows like log t instead of t.

*Privacy* (ibid. Thm. 4.1 and App. D). If a client contributes at most once per tree, it changes at
most one leaf, hence at most depth(s) = ⌈log₂(s + 1)⌉ nodes of a tree of s rounds, each by at most C:
the tree is a Gaussian mechanism of L2 sensitivity C·√depth(s) at noise σC, i.e. μ = √depth(s)/σ in
Gaussian DP, and the trees compose adaptively (Dong, Roth, Su 2019, Cor. 3.3):
μ² = Σ_trees depth(sₖ)/σ². :class:`DPFTRL` enforces the once-per-tree condition itself (a second
update of a client within one tree is dropped and counted), so the figure holds whatever the
sampling and whoever knows the sample. Trees restart every ``restart_every`` rounds (ibid. Sec. 4,
"tree restart"): the model keeps the noise released so far and a fresh tree begins.
:func:`ftrl_epsilon` is that exact Gaussian-DP figure; :func:`ftrl_epsilon_rdp` is dp_accounting's RDP
bound for the same trees (``SingleEpochTreeAggregationDpEvent``), a looser second opinion.

The noise is *central*: the server adds it, so it holds against observers of the models and against
anyone who knows the sample, not against an operator who reads the un-noised sums.

*With secure aggregation* (:meth:`DPFTRL.release_sum`): the devices clip, quantize and mask; the job
unmasks only the round's sum and adds the same tree increment to it, so the operator never sees an
individual update (it still sees each round's un-noised sum: no DP figure holds against it). The
server cannot clip or drop an update inside a masked sum, so the once-per-tree rule is applied when
the round's sample is drawn (:meth:`DPFTRL.eligible`), and the sensitivity is that of a *decoded*
contribution: the device's float32 clip (relative error below 2⁻²⁴ per coordinate) and the stochastic
rounding (below 1/s per coordinate) bound its norm by C + ``quantization_slack`` with
slack = C·2⁻²³ + √d/s, and the node noise is z·(C + slack), so the accountant's z stays exact.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from estimator.accounting.accountant import Neighbors, exact_gaussian_epsilon
from estimator.fl.aggregators import AggregateResult, Aggregator, RoundContext
from ldp_core.fl.errors import FLError
from ldp_core.fl.training import ClientUpdate, clip_to_norm
from ldp_core.privacy_events import GaussianEvent, SelfComposedEvent

__all__ = [
    "TreeNoise",
    "tree_depth",
    "tree_sizes",
    "ftrl_dp_event",
    "ftrl_epsilon",
    "ftrl_epsilon_rdp",
    "ftrl_noise_for_epsilon",
    "FtrlAccountant",
    "DPFTRL",
    "FTRL_PROTECTS",
    "ftrl_summary",
]

_STATE_VERSION = 1


def tree_depth(steps: int) -> int:
    """⌈log₂(steps + 1)⌉: how many nodes of a tree over ``steps`` rounds contain one given round."""
    if steps < 0:
        raise FLError(f"steps must be >= 0, got {steps}")
    return int(steps).bit_length()


def tree_sizes(rounds: int, restart_every: int | None) -> list[int]:
    """The number of rounds in each tree when ``rounds`` rounds restart the tree every ``restart_every``."""
    if rounds < 0:
        raise FLError(f"rounds must be >= 0, got {rounds}")
    if restart_every is None or rounds <= restart_every:
        return [rounds] if rounds else []
    if restart_every < 1:
        raise FLError(f"restart_every must be >= 1 or None, got {restart_every}")
    full, rest = divmod(rounds, restart_every)
    return [restart_every] * full + ([rest] if rest else [])


def _vec_to_text(v: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(v, "<f8").tobytes()).decode("ascii")


def _vec_from_text(s: object, dim: int) -> np.ndarray:
    if not isinstance(s, str):
        raise FLError("tree state: a node's noise must be a base64 string")
    raw = base64.b64decode(s, validate=True)
    if len(raw) != 8 * dim:
        raise FLError(f"tree state: a node holds {len(raw)} bytes, expected {8 * dim}")
    return np.frombuffer(raw, "<f8").astype(np.float64)


@dataclasses.dataclass
class TreeNoise:
    """The binary-tree noise of a stream of ``dim``-vectors, online, with restarts.

    After step t of the current tree, :attr:`nodes` holds the (level, noise) of the dyadic intervals
    of t's binary decomposition, highest level first, each noise N(0, stddev²·I) drawn from the
    generator passed to :meth:`advance` when its interval closes; :meth:`prefix` is their sum, the
    noise on the prefix sum of rounds 1..t. Going from t − 1 to t pops the k nodes of levels
    0..k − 1 (k the trailing zeros of t) and pushes one node of level k, so the state is at most
    ⌈log₂(t + 1)⌉ vectors and serializes to a small object (:meth:`to_state`). After
    ``restart_every`` steps the next :meth:`advance` starts a fresh tree.

    ``efficient``: Honaker's estimator ("Efficient use of differentially private binary trees", 2015;
    the variant Kairouz et al. 2021 use). Every node of the full tree gets noise (at step t the
    k + 1 nodes that close at t, levels 0..k), and each node's noise on the prefix is its
    minimum-variance estimate from its own draw and its two children's estimates,
    e = (v + a(e_left + e_right))/(1 + a) with a = 1/(2c_{k−1}), of variance c_k·stddev²,
    c_0 = 1, c_k = 1/(1 + 1/(2c_{k−1})) → ½. The left child is the popped decomposition node and
    the right child is computed at the same step, so the state is still the decomposition (of
    estimates). A leaf is still in one node per level, so the accounting is the same."""

    dim: int
    stddev: float
    restart_every: int | None = None
    step: int = 0
    trees: int = 0
    nodes: list[tuple[int, np.ndarray]] = dataclasses.field(default_factory=list)
    efficient: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.efficient, bool):
            raise FLError(f"efficient must be true or false, got {self.efficient!r}")
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 1:
            raise FLError(f"dim must be an integer >= 1, got {self.dim!r}")
        if not (math.isfinite(self.stddev) and self.stddev >= 0):
            raise FLError(f"stddev must be a finite number >= 0, got {self.stddev!r}")
        if self.restart_every is not None and (
            isinstance(self.restart_every, bool) or not isinstance(self.restart_every, int) or self.restart_every < 1
        ):
            raise FLError(f"restart_every must be an integer >= 1 or None, got {self.restart_every!r}")

    @property
    def restart_due(self) -> bool:
        """Whether the next :meth:`advance` starts a new tree."""
        return self.step == 0 or (self.restart_every is not None and self.step >= self.restart_every)

    def prefix(self) -> np.ndarray:
        """The noise on the current tree's prefix sum (zeros before its first step)."""
        out = np.zeros(self.dim)
        for _, v in self.nodes:
            out = out + v
        return out

    def advance(self, rng: np.random.Generator) -> np.ndarray:
        """One more step; returns the increment of the released noise, prefix(t) − prefix(t − 1)
        (the whole prefix at a tree's first step: the model keeps the previous trees' noise)."""
        if self.restart_due:
            self.nodes, self.step = [], 0
            self.trees += 1
            before = np.zeros(self.dim)
        else:
            before = self.prefix()
        self.step += 1
        level = (self.step & -self.step).bit_length() - 1  # trailing zeros of the step
        popped = [self.nodes.pop() for _ in range(level)]  # levels 0, 1, ..., level − 1
        assert [lvl for lvl, _ in popped] == list(range(level))
        if not self.efficient:
            self.nodes.append((level, self._draw(rng)))
            return self.prefix() - before
        estimate, c = self._draw(rng), 1.0  # the leaf closing now
        for j in range(1, level + 1):
            a = 1.0 / (2.0 * c)
            estimate = (self._draw(rng) + a * (popped[j - 1][1] + estimate)) / (1.0 + a)
            c = 1.0 / (1.0 + a)
        self.nodes.append((level, estimate))
        return self.prefix() - before

    def _draw(self, rng: np.random.Generator) -> np.ndarray:
        return rng.normal(0.0, self.stddev, size=self.dim) if self.stddev > 0 else np.zeros(self.dim)

    def to_state(self) -> dict[str, Any]:
        """A JSON object (vectors as base64 little-endian float64) that :meth:`from_state` reads back exactly."""
        return {
            "v": _STATE_VERSION,
            "dim": self.dim,
            "stddev": self.stddev,
            "restart_every": self.restart_every,
            "step": self.step,
            "trees": self.trees,
            "nodes": [[lvl, _vec_to_text(v)] for lvl, v in self.nodes],
            "efficient": self.efficient,
        }

    @classmethod
    def from_state(cls, obj: Mapping[str, Any]) -> TreeNoise:
        """The tree of :meth:`to_state`; a malformed state is refused with :class:`FLError`."""
        if not isinstance(obj, Mapping) or obj.get("v") != _STATE_VERSION:
            raise FLError(f"tree state: expected an object with v = {_STATE_VERSION}")
        try:
            tree = cls(
                int(obj["dim"]),
                float(obj["stddev"]),
                obj["restart_every"],
                int(obj["step"]),
                int(obj["trees"]),
                efficient=obj.get("efficient", False),
            )
            nodes = [(int(lvl), _vec_from_text(v, tree.dim)) for lvl, v in obj["nodes"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise FLError(f"tree state is malformed: {exc}") from None
        expected = [b for b in range(tree.step.bit_length() - 1, -1, -1) if tree.step >> b & 1]
        if [lvl for lvl, _ in nodes] != expected:
            raise FLError(f"tree state: node levels {[lvl for lvl, _ in nodes]} do not decompose step {tree.step}")
        tree.nodes = nodes
        return tree


# -- accounting ------------------------------------------------------------------------------------
def _check(noise_multiplier: float, rounds: int) -> None:
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise FLError(f"noise_multiplier must be a finite number > 0, got {noise_multiplier}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise FLError(f"rounds must be an integer >= 0, got {rounds!r}")


def ftrl_dp_event(noise_multiplier: float, rounds: int, restart_every: int | None = None) -> Any:
    """dp_accounting's event for ``rounds`` rounds of DP-FTRL, each client at most once per tree: one
    ``SingleEpochTreeAggregationDpEvent`` per tree (a client may be in every tree), composed."""
    import dp_accounting

    _check(noise_multiplier, rounds)
    sizes = tree_sizes(rounds, restart_every)
    parts: list[Any] = []
    for size in sorted(set(sizes), reverse=True):
        ev = dp_accounting.SingleEpochTreeAggregationDpEvent(float(noise_multiplier), size)
        n = sizes.count(size)
        parts.append(ev if n == 1 else dp_accounting.SelfComposedDpEvent(ev, n))
    return parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)


def _effective(noise_multiplier: float, neighbors: Neighbors) -> float:
    if neighbors not in ("add_or_remove", "replace"):
        raise FLError(f"neighbors must be 'add_or_remove' or 'replace', got {neighbors!r}")
    return noise_multiplier / 2.0 if neighbors == "replace" else noise_multiplier  # replacing moves a node by 2C


def ftrl_epsilon(
    noise_multiplier: float,
    rounds: int,
    delta: float,
    restart_every: int | None = None,
    neighbors: Neighbors = "add_or_remove",
) -> float:
    """Exact ε at ``delta`` of DP-FTRL (see the module docstring): the trees compose to one Gaussian
    mechanism with μ² = Σ_trees depth(s)/z² (replace-one neighbours: z/2 for z). 0 for no round."""
    _check(noise_multiplier, rounds)
    levels = sum(tree_depth(s) for s in tree_sizes(rounds, restart_every))
    if levels == 0:
        return 0.0
    _effective(noise_multiplier, neighbors)
    eps = exact_gaussian_epsilon(SelfComposedEvent(GaussianEvent(noise_multiplier), levels), delta, neighbors)
    assert eps is not None  # unsampled Gaussian releases have the exact form
    return eps


def ftrl_epsilon_rdp(
    noise_multiplier: float,
    rounds: int,
    delta: float,
    restart_every: int | None = None,
    neighbors: Neighbors = "add_or_remove",
) -> float:
    """dp_accounting's RDP bound for the same trees (:func:`ftrl_dp_event`; its tree event is defined for
    replace-with-a-null-record neighbours, which is add/remove here since the denominator is fixed)."""
    import dp_accounting

    z = _effective(noise_multiplier, neighbors)
    if rounds == 0:
        _check(noise_multiplier, rounds)
        return 0.0
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    acc.compose(ftrl_dp_event(z, rounds, restart_every))
    return float(acc.get_epsilon(delta))


def ftrl_noise_for_epsilon(
    target_epsilon: float,
    rounds: int,
    delta: float,
    restart_every: int | None = None,
    neighbors: Neighbors = "add_or_remove",
) -> float:
    """The smallest per-node multiplier z whose :func:`ftrl_epsilon` is at most ``target_epsilon``
    (bisection on log z, ε decreasing in z, to a relative 1e-12 in z)."""
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise FLError(f"target_epsilon must be a finite number > 0, got {target_epsilon}")
    lo, hi = 1e-4, 1e4
    if ftrl_epsilon(hi, rounds, delta, restart_every, neighbors) > target_epsilon:
        raise FLError(f"no noise multiplier up to {hi:g} reaches ε = {target_epsilon} over {rounds} rounds")
    while hi / lo > 1 + 1e-12:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ftrl_epsilon(mid, rounds, delta, restart_every, neighbors) > target_epsilon else (lo, mid)
    return hi


class FtrlAccountant:
    """Client-level (ε, δ) of the DP-FTRL rounds run so far, for the job and the scenarios: the same
    interface as :class:`estimator.fl.dp.ClientLevelAccountant` (``record``, ``rounds``, ``epsilon``,
    ``epsilon_known_sample``), with one figure for every adversary that sees only the models:
    no amplification is credited, so knowing the sample changes nothing."""

    amplification: ClassVar[bool] = False

    def __init__(self, restart_every: int | None, delta: float, neighbors: Neighbors = "add_or_remove") -> None:
        if not 0.0 < delta < 1.0:
            raise FLError(f"delta must be in (0, 1), got {delta}")
        tree_sizes(1, restart_every)
        if restart_every is not None and restart_every < 1:
            raise FLError(f"restart_every must be >= 1 or None, got {restart_every}")
        _effective(1.0, neighbors)
        self.restart_every = restart_every
        self.delta = float(delta)
        self.neighbors: Neighbors = neighbors
        self.noise_multiplier: float | None = None
        self._rounds = 0

    @property
    def rounds(self) -> int:
        return self._rounds

    def record(self, noise_multiplier: float) -> None:
        """One DP-FTRL round at noise multiplier z (fixed for the whole run: the tree's nodes share it)."""
        z = float(noise_multiplier)
        if not (math.isfinite(z) and z > 0):
            raise FLError(f"DP-FTRL needs a noise multiplier > 0, got {noise_multiplier}")
        if self.noise_multiplier is not None and z != self.noise_multiplier:
            raise FLError(f"DP-FTRL's noise multiplier is fixed for the run: {self.noise_multiplier}, got {z}")
        self.noise_multiplier = z
        self._rounds += 1

    def epsilon(self) -> float:
        """:func:`ftrl_epsilon` of the rounds recorded (0 before any)."""
        if self.noise_multiplier is None:
            return 0.0
        return ftrl_epsilon(self.noise_multiplier, self._rounds, self.delta, self.restart_every, self.neighbors)

    def epsilon_known_sample(self) -> float:
        """The same figure: DP-FTRL does not rest on the sample being secret."""
        return self.epsilon()

    def epsilon_amplified(self) -> float:
        """The same figure (nothing is amplified)."""
        return self.epsilon()


# -- the aggregator --------------------------------------------------------------------------------
@dataclasses.dataclass
class DPFTRL:
    """DP-FTRL around a linear aggregator: clip each update to ``clip_norm`` (all weigh the same), sum
    with ``inner``, add the tree noise's increment (:meth:`TreeNoise.advance`, per-node multiplier
    ``noise_multiplier``), divide by the expected client count. The strategy's x ← x + η Δ̄ then makes
    the model exactly the FTRL iterate w_0 + η (Σ_t clipped sums + n_t)/m̄ of the current tree (plus
    the noise earlier trees released). A client's second update within one tree is dropped
    (``info["repeated"]``): the accounting allows one contribution per tree. ``efficient``: Honaker's
    estimator (:class:`TreeNoise`), less noise at the same ε. :meth:`state` /
    :meth:`load_state` carry the tree and the tree's contributors through a checkpoint."""

    inner: Aggregator
    clip_norm: float
    noise_multiplier: float
    restart_every: int | None = None
    accountant: FtrlAccountant | None = None
    efficient: bool = False
    quantization_slack: float = 0.0
    linear: bool = dataclasses.field(default=False, init=False)
    tree: TreeNoise | None = dataclasses.field(default=None, init=False)
    contributed: set[str] = dataclasses.field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if not getattr(self.inner, "linear", False):
            raise FLError(
                f"DPFTRL needs a linear inner aggregator (a weighted sum); {type(self.inner).__name__} is not"
            )
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise FLError(f"clip_norm must be a finite number > 0, got {self.clip_norm}")
        if not (math.isfinite(self.noise_multiplier) and self.noise_multiplier > 0):
            raise FLError(f"DP-FTRL needs noise_multiplier > 0, got {self.noise_multiplier}")
        tree_sizes(1, self.restart_every)
        if self.restart_every is not None and (isinstance(self.restart_every, bool) or self.restart_every < 1):
            raise FLError(f"restart_every must be an integer >= 1 or None, got {self.restart_every!r}")
        if not (math.isfinite(self.quantization_slack) and self.quantization_slack >= 0):
            raise FLError(f"quantization_slack must be a finite number >= 0, got {self.quantization_slack}")

    @property
    def noise_stddev(self) -> float:
        """Every node's standard deviation: z·(C + slack), z times the L2 sensitivity of one contribution."""
        return self.noise_multiplier * (self.clip_norm + self.quantization_slack)

    def _tree_for(self, dim: int) -> TreeNoise:
        if self.tree is None:
            self.tree = TreeNoise(dim, self.noise_stddev, self.restart_every, efficient=self.efficient)
        if self.tree.dim != dim:
            raise FLError(f"the tree's noise has {self.tree.dim} coordinates, the round {dim}")
        if self.tree.restart_due:
            self.contributed = set()
        return self.tree

    def eligible(self, client_ids: Sequence[str]) -> list[str]:
        """The clients (in the given order) that may contribute to the next round: all of them when it
        starts a tree, else those without an update in the current tree. With SecAgg the job applies it
        to the round's sample, since no update can be dropped from a masked sum afterwards."""
        if self.tree is None or self.tree.restart_due:
            return list(client_ids)
        return [c for c in client_ids if c not in self.contributed]

    def release_sum(
        self, total: np.ndarray, contributors: Sequence[str], ctx: RoundContext, info: Mapping[str, Any] | None = None
    ) -> AggregateResult:
        """The round's release from an already summed vector (SecAgg's unmasked sum of the contributors'
        clipped updates): total plus the tree's increment, over the expected client count. The
        contributors must be :meth:`eligible` (a repeat would void the accounting: refused)."""
        tree = self._tree_for(ctx.num_params)
        total = np.asarray(total, dtype=np.float64)
        if total.shape != (ctx.num_params,):
            raise FLError(f"the sum has shape {total.shape}, the round {ctx.num_params} coordinates")
        repeats = sorted(set(contributors) & self.contributed)
        if repeats or len(set(contributors)) != len(contributors):
            raise FLError(f"clients contributed twice to one tree: {repeats or sorted(contributors)}")
        increment = tree.advance(ctx.rng)
        self.contributed.update(contributors)
        if self.accountant is not None:
            self.accountant.record(self.noise_multiplier)
        out = dict(info or {})
        out.update(
            clip_norm=self.clip_norm,
            noise_stddev=self.noise_stddev,
            tree_step=tree.step,
            tree_nodes=len(tree.nodes),
            trees=tree.trees,
        )
        if self.accountant is not None:
            out["rounds_accounted"] = self.accountant.rounds
            out["epsilon"] = self.accountant.epsilon()
            out["delta"] = self.accountant.delta
        return AggregateResult((total + increment) / ctx.expected_clients, ctx.expected_clients, len(contributors), out)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        self._tree_for(ctx.num_params)
        fresh = [u for u in updates if u.client_id not in self.contributed]
        clipped, n_clipped = [], 0
        for u in fresh:
            d, norm = clip_to_norm(np.asarray(u.delta, dtype=np.float64), self.clip_norm)
            n_clipped += norm > self.clip_norm
            clipped.append(dataclasses.replace(u, delta=d, num_examples=1))
        res = self.inner.aggregate(clipped, ctx)
        info = dict(res.info)
        info.update(clipped_fraction=n_clipped / max(1, len(fresh)), repeated=len(updates) - len(fresh))
        out = self.release_sum(res.delta * res.total_weight, [u.client_id for u in fresh], ctx, info)
        return AggregateResult(out.delta, out.total_weight, res.num_clients, out.info)

    def state(self) -> dict[str, Any] | None:
        """The tree and the current tree's contributors as a JSON object (None before the first round)."""
        if self.tree is None:
            return None
        return {"tree": self.tree.to_state(), "contributed": sorted(self.contributed)}

    def load_state(self, obj: Mapping[str, Any] | None) -> None:
        """Restore :meth:`state` (None: no round yet)."""
        if obj is None:
            self.tree, self.contributed = None, set()
            return
        tree = TreeNoise.from_state(obj["tree"])
        if (tree.stddev, tree.restart_every, tree.efficient) != (
            self.noise_stddev,
            self.restart_every,
            self.efficient,
        ):
            raise FLError("the checkpoint's tree was built for another noise or restart setting")
        self.tree, self.contributed = tree, {str(c) for c in obj["contributed"]}


FTRL_PROTECTS = (
    "{what}, against anyone who sees the released models, "
    "including whoever knows which clients took part in each round: DP-FTRL assumes no sampling "
    "(each client contributes at most once per tree, clipped to the bound the noise multiplier refers to); "
    "not against a server that adds the noise itself and sees the un-noised sums"
)


def ftrl_summary(
    noise_multiplier: float,
    rounds: int,
    delta: float,
    restart_every: int | None = None,
    neighbors: Neighbors = "add_or_remove",
) -> dict[str, Any]:
    """``ldp privacy ftrl``'s answer as a JSON-ready dict: the client-level ε of ``rounds`` rounds of DP-FTRL
    (exact Gaussian DP, key ``epsilon``, and dp_accounting's RDP bound, ``epsilon_rdp``), the trees, the
    noise nodes each client's contribution reaches, and what the figure protects."""
    sizes = tree_sizes(rounds, restart_every)
    what = (
        "whether one client's data was used at all"
        if neighbors == "add_or_remove"
        else "what one client's data is (replace-one neighbours)"
    )
    return {
        "epsilon": ftrl_epsilon(noise_multiplier, rounds, delta, restart_every, neighbors),
        "epsilon_rdp": ftrl_epsilon_rdp(noise_multiplier, rounds, delta, restart_every, neighbors),
        "delta": delta,
        "noise_multiplier": noise_multiplier,
        "rounds": rounds,
        "restart_every": restart_every,
        "trees": len(sizes),
        "restarts": len(sizes) - 1,
        "nodes_per_client": sum(tree_depth(s) for s in sizes),
        "neighbors": neighbors,
        "accountant": "exact Gaussian DP of the composed trees (Dong, Roth, Su 2019); "
        "epsilon_rdp: dp_accounting RDP, SingleEpochTreeAggregationDpEvent",
        "protects": FTRL_PROTECTS.format(what=what),
    }
