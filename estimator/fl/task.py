"""A federated task: what the aggregation job runs, as a frozen, validated value read from a JSON task file.

:class:`FLTaskSpec` holds the task file's fields (docs/fl/TASK.md).
Its ``sampling``, ``aggregator`` and ``noise`` are typed specs rather than the
file's ``{"kind": ...}`` objects (:mod:`estimator.fl.options`,
:mod:`estimator.fl.aggregator_specs`): each is read with a message that names
what is wrong and written back with ``to_dict``. So the file format stays one
JSON object, while the code that builds the sampling scheme and the
aggregator stack (:meth:`FLTaskSpec.build_sampling`,
:meth:`FLTaskSpec.build_aggregator`) dispatches on types, not on strings.
The task's other options (personalization, local DP-SGD, compression) are
checked by :mod:`estimator.fl.options`. Every refusal is an
:class:`~ldp_core.fl.errors.FLError`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

from estimator.fl.aggregator_specs import (
    AggregatorSpec,
    DPFTRLSpec,
    FedAvgSpec,
    FLAccountant,
    FLTrustSpec,
    aggregator_spec,
)
from estimator.fl.aggregators import Aggregator
from estimator.fl.dp import ClientLevelAccountant
from estimator.fl.ftrl import FtrlAccountant
from estimator.fl.options import (
    NoiseSpec,
    SamplingSpec,
    check_compression,
    check_local_dp_sgd,
    check_personalization,
    noise_spec,
    read_base64,
    read_int,
    read_number,
    sample_level_privacy,
    sampling_spec,
)
from estimator.fl.personalization import Ditto, Moon, PerFedAvg
from estimator.fl.sampling import Sampling
from estimator.fl.strategies import FedAvg, FedProx, Scaffold, Strategy
from ldp_core.fl.errors import FLError, ModelError, build_from_fields
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, local_dp_sgd_from_dict
from ldp_core.fl.personalization import (
    DittoSpec,
    MoonSpec,
    PerFedAvgSpec,
    personalization_from_dict,
)
from ldp_core.fl.protocol import model_from_dict
from ldp_core.fl.training import LocalTraining

__all__ = ["FLTaskSpec", "resolve_task_paths", "EXAMPLE_ENROLLMENT_KEY"]

#: the public key of ``examples/fl/example-authority.json``, the quickstart's authority: its private key is in
#: the repository, so a task that trusts it lets anyone pose as its devices (``ldp fl job`` warns)
EXAMPLE_ENROLLMENT_KEY = "9b88+1etTqtrfDoL291S91gKUKDKfCiigeKui+8ieeQ="


def resolve_task_paths(d: Mapping[str, Any], base_dir: str) -> dict[str, Any]:
    """A copy of the task object ``d`` with its file paths (``fltrust``'s ``root_data``) made absolute against
    ``base_dir`` (the task file's directory) where they are relative."""
    import os

    out = dict(d)
    agg = out.get("aggregator")
    if isinstance(agg, Mapping) and agg.get("kind") == FLTrustSpec.kind:
        root = agg.get("root_data")
        if isinstance(root, str) and root and not os.path.isabs(root):
            out["aggregator"] = {**agg, "root_data": os.path.join(base_dir, root)}
    return out


# -- the task --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FLTaskSpec:
    """What the job runs (frozen, validated; JSON via :meth:`from_dict`/:meth:`to_dict`).

    The typed specs named below are in :mod:`estimator.fl.options` (sampling, noise) and
    :mod:`estimator.fl.aggregator_specs` (aggregators).

    ``sampling`` is a :data:`SamplingSpec` (in the file ``{"kind": "poisson", "rate": q}`` or
    ``{"kind": "fixed", "count": m}``; a mapping given here is read by :func:`sampling_spec`);
    ``clip_norm`` C turns on client-level DP (devices clip to C, the server
    clips again and adds N(0, (σC)²) with σ = ``noise_multiplier``); ``secagg``
    needs C (the quantizer's range). ``round_timeout`` bounds the plain
    ``train`` phase, ``phase_timeout`` each SecAgg phase (seconds). ``seed``
    fixes the job's generator (sampling, SecAgg graph, noise) for
    simulations; ``None`` (production) draws every value from the OS CSPRNG
    (:func:`ldp_core.randomness.secure_generator`: an observer of released
    models must not be able to predict the noise or the sample, which a
    seeded PCG64 would allow) and keeps no generator state in checkpoints.

    Devices are authenticated (:mod:`ldp_core.tokens.enrollment`): ``enrollment_key`` (required) is the base64
    Ed25519 public key of the operator's enrollment authority; every upload must be signed by a device
    whose credential it issued for that client id (collector and job both check). ``task_signature`` is
    the authority's signature (base64, ``ldp fl sign-task``) of :meth:`signed_config` (the task name,
    secagg, ``secagg_threshold`` and the enrollment key): devices refuse a SecAgg round whose
    configuration is not signed, and take t from it, so a malicious server cannot lower it.
    ``max_colluders`` (c, default 1) is the number of colluding share holders of any one client that secure
    aggregation must withstand (a server that controls c of a client's k holders and shows the others
    inconsistent survivor sets rebuilds both its secrets iff k + c ≥ 2t: docs/fl/SECAGG.md); with
    ``secagg`` it is signed together with the task's client set, and devices refuse a round whose
    threshold, holder count and c allow that split, and adverts from ids outside the client set.
    ``secagg_threshold`` fixes t (> c; the job then keeps each client's degree k with t ≤ k < 2t − c);
    None lets the job use t = ⌊(k + c)/2⌋ + 1 (raising k to at least c + 2, or n − 1).

    ``aggregator`` (an :data:`AggregatorSpec`; a mapping is read by :func:`aggregator_spec`) picks the
    server's stack (:meth:`build_aggregator`):

    * ``{"kind": "fedavg"}`` (default, :class:`FedAvgSpec`): the weighted mean, under
      ``FixedClippingDP`` when ``clip_norm`` is set (devices clip to C too).
    * ``{"kind": "adaptive_clipping", "target_quantile": γ, "clip_learning_rate": η_C,
      "count_stddev": σ_b}`` (:class:`AdaptiveClippingSpec`; the last three optional: 0.5, 0.2,
      expected clients / 20): ``AdaptiveClippingDP`` starting at C = ``clip_norm`` with overall noise
      multiplier z = ``noise_multiplier`` > 0 (the count's noise is paid for on the updates, as the
      wrapper documents; needs σ_b > z/2). Devices do not clip: the server needs each
      update's norm against C (the bit 1[‖Δ‖ ≤ C]); the current C is in the round's ``stats``.
      Not with ``secagg`` (that bit is not securely summed).
    * ``{"kind": "dp_ftrl", "restart_every": R}`` (:class:`DPFTRLSpec`; R optional, null): DP-FTRL
      (:mod:`estimator.fl.ftrl`), tree-aggregated noise of multiplier z = ``noise_multiplier`` > 0 per
      node, no sampling assumption (the same ε for every adversary that sees only the models). With
      ``secagg`` the tree noise goes on the unmasked sum (central: nothing against the operator). Not
      with ``scaffold`` or distributed noise.
    * ``{"kind": "median", "f": f}``, ``{"kind": "trimmed_mean", "f": f}``,
      ``{"kind": "krum", "f": f, "multi": m}`` (:class:`MedianSpec`, :class:`TrimmedMeanSpec`,
      :class:`KrumSpec`; m optional, 1): the robust wrappers over a weighted mean, tolerating f
      malicious clients. They are not linear, so they run without DP (``clip_norm`` null,
      ``noise_multiplier`` 0) and without ``secagg`` (they need every individual update; secure
      aggregation reveals only the sum). A round with fewer updates than the wrapper needs
      (2f + 1; Krum 2f + 3) fails without release.
    * ``{"kind": "fltrust", "root_data": "PATH.npz"}`` (:class:`FLTrustSpec`): FLTrust against a root update the
      job trains each round on its trusted root dataset (:mod:`estimator.fl.fltrust_root`); without ``secagg``,
      with ``fedavg`` or ``fedprox``, ditto or perfedavg (not ``scaffold``, moon, ``local_dp_sgd``). Client-level
      DP only with ``"divisor": "expected_clients"`` (DP-FLTrust, :class:`~estimator.fl.dp.DPFLTrust`).

    ``noise`` (a :data:`NoiseSpec`; a mapping is read by :func:`noise_spec`): None keeps the central
    noise above; ``{"kind": "distributed_discrete_gaussian", "bits": b, ...}`` (:class:`DistributedDGSpec`)
    has the devices add the noise σ·C as discrete Gaussian shares before SecAgg, so that the printed ε
    holds against the server operator too (:mod:`ldp_core.fl.ddg`, :mod:`estimator.fl.ddg_accounting`).

    ``personalization`` (None, or ``{"kind": "ditto", "lam": λ}``, ``{"kind": "perfedavg",
    "inner_learning_rate": α, "eval_steps": s}``, ``{"kind": "moon", "mu": μ, "tau": τ}``; algorithm
    ``fedavg``; MOON needs an ``mlp`` model): the devices' local objective
    (:mod:`ldp_core.fl.personalization`); the server step and the upload stay FedAvg's, so every
    aggregator above applies. Ditto's personal model and MOON's previous model live in the device's
    memory (:class:`~ldp_core.fl.training.ClientState`) and never leave it.

    ``local_dp_sgd`` (None, or ``{"noise_multiplier": σ, "clip": c, "sample_rate": q, "steps": T}`` with
    ``"epochs": E`` in place of ``steps``; :mod:`ldp_core.fl.local_dpsgd`): the devices train each round by
    DP-SGD on their own examples, sample-level DP for one example of one device that holds even against the
    server seeing the update in the clear, under the client-level DP above (one device's whole data against
    whoever sees the models). It goes into :meth:`signed_config` (devices take it from there only) and needs
    ``fedavg`` without personalization, ``training`` with ``learning_rate`` only, and a ``task_signature``
    when the job runs it; :meth:`sample_level_privacy` is the ε the job states."""

    task: str
    model: Mapping[str, Any]
    clients: tuple[str, ...]
    rounds: int
    sampling: SamplingSpec
    algorithm: str = "fedavg"
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prox_mu: float = 0.01
    server_learning_rate: float = 1.0
    clip_norm: float | None = None
    noise_multiplier: float = 0.0
    delta: float = 1e-5
    secagg: bool = False
    secagg_degree: int | None = None
    round_timeout: float = 60.0
    phase_timeout: float = 30.0
    seed: int | None = None
    aggregator: AggregatorSpec = dataclasses.field(default_factory=FedAvgSpec)
    enrollment_key: str | None = None
    task_signature: str | None = None
    secagg_threshold: int | None = None
    noise: NoiseSpec | None = None
    personalization: Mapping[str, Any] | None = None
    local_dp_sgd: Mapping[str, Any] | None = None
    compression: Mapping[str, Any] | None = None
    max_colluders: int = 1
    pate: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "clients", tuple(self.clients))
        if not self.clients or len(set(self.clients)) != len(self.clients):
            raise FLError("clients must be a non-empty list of distinct client ids")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            raise FLError(f"rounds must be a positive integer, got {self.rounds!r}")
        self.build_model()
        object.__setattr__(self, "sampling", sampling_spec(self.sampling))
        self.build_sampling()
        self.local_training()
        if self.algorithm not in ("fedavg", "fedprox", "scaffold"):
            raise FLError(f"algorithm must be fedavg, fedprox or scaffold, got {self.algorithm!r}")
        read_number("server_learning_rate", self.server_learning_rate)
        read_number("noise_multiplier", self.noise_multiplier, strict=False)
        read_number("round_timeout", self.round_timeout)
        read_number("phase_timeout", self.phase_timeout)
        if not 0 < self.delta < 1:
            raise FLError(f"delta must be in (0, 1), got {self.delta!r}")
        object.__setattr__(self, "aggregator", aggregator_spec(self.aggregator))
        self.aggregator.check(self)
        if self.clip_norm is not None:
            read_number("clip_norm", self.clip_norm)
        elif self.noise_multiplier:
            raise FLError("noise_multiplier needs clip_norm (the noise is σ·C)")
        self._check_pate()
        if self.secagg and self.clip_norm is None and self.pate is None:
            raise FLError("secagg needs clip_norm: devices clip to C and quantize values in [-C, C]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise FLError(f"seed must be an integer >= 0 or null, got {self.seed!r}")
        self.authority_key  # noqa: B018 - checks enrollment_key
        if self.task_signature is not None and len(read_base64("task_signature", self.task_signature)) != 64:
            raise FLError("task_signature must be base64 of a 64-byte Ed25519 signature")
        if self.secagg_threshold is not None:
            read_int("secagg_threshold", self.secagg_threshold, 2)
            if not self.secagg:
                raise FLError("secagg_threshold needs secagg")
        read_int("max_colluders", self.max_colluders, 0)
        if self.secagg_threshold is not None and self.secagg_threshold <= self.max_colluders:
            raise FLError(
                f"secagg_threshold {self.secagg_threshold} must exceed max_colluders {self.max_colluders}: "
                "no neighbour graph has 2t > k + c with k >= t otherwise"
            )
        count = getattr(self.sampling, "count", None)
        if self.secagg and isinstance(count, int) and count >= 3 and self.max_colluders >= count - 1:
            raise FLError(
                f"max_colluders {self.max_colluders} cannot be withstood by secure aggregation on the {count} clients "
                f"sampled per round: 2t > k + c with t <= k needs k > c neighbours, and a client has at most {count - 1}"
            )
        object.__setattr__(self, "noise", noise_spec(self.noise))
        if self.noise is not None:
            self.noise.check(self)
        object.__setattr__(
            self, "personalization", check_personalization(self.personalization, self.algorithm, self.model)
        )
        object.__setattr__(
            self,
            "local_dp_sgd",
            check_local_dp_sgd(self.local_dp_sgd, self.algorithm, self.personalization, self.training),
        )
        compression = check_compression(
            self.compression,
            secagg=self.secagg,
            distributed_noise=self.noise is not None,
            aggregator=self.aggregator.kind,
        )
        object.__setattr__(self, "compression", compression)
        self.build_compression()

    def _check_pate(self) -> None:
        """A PATE task (``pate``, :mod:`ldp_core.fl.pate`): one SecAgg round of vote vectors, no model update."""
        if self.pate is None:
            return
        from ldp_core.fl.pate import PateTaskSpec

        p = PateTaskSpec.from_dict(self.pate)
        object.__setattr__(self, "pate", p.to_dict())
        if not self.secagg:
            raise FLError("a pate task needs secagg: true (the server may see only the sum of the teachers' votes)")
        if self.rounds != 1:
            raise FLError(f"a pate task has one round (one batch of queries), got rounds {self.rounds}")
        others = {
            "clip_norm": self.clip_norm,
            "noise": self.noise,
            "compression": self.compression,
            "local_dp_sgd": self.local_dp_sgd,
            "personalization": self.personalization,
        }
        bad = sorted(k for k, v in others.items() if v is not None)
        if bad or self.noise_multiplier or self.algorithm != "fedavg" or self.aggregator.kind != "fedavg":
            raise FLError(
                f"a pate task releases labels, not a model: {bad or 'noise_multiplier/algorithm/aggregator'} "
                "do not apply (the noise is pate.sigma)"
            )
        if p.noise == "distributed" and not p.sigma / len(self.clients) ** 0.5 >= 0.5:
            raise FLError(
                f"pate.noise distributed: each teacher's share σ/√n = {p.sigma / len(self.clients) ** 0.5:.3g} "
                "must be >= 1/2 (KLS21's bound)"
            )
        k = getattr(self.build_model(), "n_classes", None)
        if k != p.classes:
            raise FLError(f"the teachers' model must predict pate.classes = {p.classes} classes, it has {k}")

    @property
    def pate_spec(self) -> Any:
        """The :class:`ldp_core.fl.pate.PateTaskSpec` of a PATE task, else None."""
        from ldp_core.fl.pate import PateTaskSpec

        return None if self.pate is None else PateTaskSpec.from_dict(self.pate)

    def payload_size(self) -> int:
        """The length of what a device uploads: the vote vector Q·K of a PATE task, else the strategy's."""
        if self.pate is not None:
            return int(self.pate["queries"]) * int(self.pate["classes"])
        return self.build_strategy().payload_size(self.build_model().num_params)

    def local_training(self) -> LocalTraining:
        """The ``training`` object as :class:`~ldp_core.fl.training.LocalTraining` (a wrong field name is an
        :class:`FLError` naming it and the accepted ones)."""
        if not isinstance(self.training, Mapping):
            raise FLError(f"training must be an object, got {self.training!r}")
        return build_from_fields("training", LocalTraining, self.training)

    @property
    def local_dp_sgd_spec(self) -> LocalDPSGDSpec | None:
        """The devices' DP-SGD (None: plain local SGD)."""
        return local_dp_sgd_from_dict(self.local_dp_sgd)

    def sample_level_privacy(self, rounds: int | None = None, add_remove: bool = True) -> dict[str, Any] | None:
        """The sample-level ε of ``local_dp_sgd`` (None without it) for a device that took part in ``rounds``
        rounds (default: every round of the task, the worst case over devices, since any device may be
        sampled every round), at the task's δ: :func:`~estimator.fl.options.sample_level_privacy`."""
        return sample_level_privacy(
            self.local_dp_sgd_spec, self.rounds if rounds is None else rounds, self.delta, add_remove
        )

    def build_compression(self) -> Any:
        """The task's :class:`ldp_core.fl.compress.RingQuantization` or
        :class:`ldp_core.fl.ring_sketch.RingCountSketch` (None without compression)."""
        if self.compression is None:
            return None
        from ldp_core.fl.ring_sketch import ring_compression_for_task

        assert self.clip_norm is not None
        dim = self.build_strategy().payload_size(self.build_model().num_params)
        try:
            return ring_compression_for_task(dict(self.compression), float(self.clip_norm), len(self.clients), dim)
        except ModelError as exc:
            raise FLError(f"compression: {exc}") from None

    @property
    def authority_key(self) -> bytes:
        """The enrollment authority's raw Ed25519 public key (32 bytes)."""
        if self.enrollment_key is None:
            raise FLError(
                "enrollment_key is required: the base64 public key of the authority that enrolls the task's "
                "devices (create one with `ldp fl enroll --init-authority FILE`); uploads are authenticated with it"
            )
        raw = read_base64("enrollment_key", self.enrollment_key)
        if len(raw) != 32:
            raise FLError(f"enrollment_key must be base64 of 32 bytes (an Ed25519 public key), got {len(raw)} bytes")
        return raw

    def signed_config(self) -> dict[str, Any]:
        """What ``task_signature`` signs and devices check before they trust a round's SecAgg parameters."""
        out: dict[str, Any] = {
            "v": 1,
            "task": self.task,
            "secagg": self.secagg,
            "secagg_threshold": self.secagg_threshold,
            "enrollment_key": self.enrollment_key,
        }
        if self.secagg:  # devices refuse rounds whose t, holders and c allow a split, and adverts of outsiders
            out["max_colluders"] = self.max_colluders
            out["clients"] = sorted(self.clients)
        if self.local_dp_sgd is not None:  # devices take their DP-SGD from here, never from the server's word
            out["local_dp_sgd"] = {**self.local_dp_sgd, "delta": self.delta}
        if self.noise is not None:  # devices derive their noise share from these, never from the server's word
            spec = self.noise.build(self, self.build_strategy().payload_size(self.build_model().num_params))
            out["ddg"] = {**spec.to_dict(), "min_shares": self.noise.shares(self)}
        if self.compression is not None:  # devices quantize with these, never with the server's word
            out["compression"] = self.build_compression().to_dict()
        if self.pate is not None:  # devices vote only on the queries of this digest, with this noise share
            out["pate"] = dict(self.pate)
        return out

    @property
    def device_clip_norm(self) -> float | None:
        """What devices clip to (published in the round state): C for ``fedavg`` with DP, else None."""
        return self.clip_norm if self.aggregator.device_clips else None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FLTaskSpec:
        """The task of a task file's JSON object; unknown fields are refused."""
        if not isinstance(d, Mapping):
            raise FLError(f"a task is one JSON object, got {type(d).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = set(d) - set(names)
        if unknown:
            raise FLError(f"unknown task fields {sorted(unknown)}; known: {sorted(names)}")
        return build_from_fields("task", cls, d)  # names a missing required field, not a TypeError

    @classmethod
    def from_file(cls, path: str) -> FLTaskSpec:
        """The task of the JSON task file at ``path``; a relative ``root_data`` (``fltrust``) is relative to the
        file's directory (:func:`resolve_task_paths`). A file that is not a JSON object is an :class:`FLError`."""
        import json
        import os

        try:
            with open(path) as f:
                d = json.load(f)
        except (OSError, ValueError) as exc:
            raise FLError(f"task file {path!r}: {exc}") from None
        if not isinstance(d, Mapping):
            raise FLError(f"task file {path!r} must hold one JSON object, got {type(d).__name__}")
        return cls.from_dict(resolve_task_paths(d, os.path.dirname(os.path.abspath(path))))

    def to_dict(self) -> dict[str, Any]:
        """The task file's JSON object (:meth:`from_dict` of it gives an equal spec)."""
        out = {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}
        out["clients"] = list(self.clients)
        out["model"], out["training"] = dict(out["model"]), dict(out["training"])
        out["sampling"] = self.sampling.to_dict()
        out["aggregator"] = self.aggregator.to_dict()
        out["noise"] = None if self.noise is None else self.noise.to_dict()
        out["local_dp_sgd"] = None if self.local_dp_sgd is None else dict(self.local_dp_sgd)
        out["compression"] = None if self.compression is None else dict(self.compression)
        out["pate"] = None if self.pate is None else dict(self.pate)
        return out

    def build_model(self) -> Any:
        return model_from_dict(self.model)

    def build_sampling(self) -> Sampling:
        return self.sampling.build(len(self.clients))

    def build_strategy(self) -> Strategy:
        tr = self.local_training()
        spec = personalization_from_dict(self.personalization)
        if isinstance(spec, DittoSpec):
            return Ditto(tr, self.server_learning_rate, spec=spec)
        if isinstance(spec, PerFedAvgSpec):
            return PerFedAvg(tr, self.server_learning_rate, spec=spec)
        if isinstance(spec, MoonSpec):
            return Moon(tr, self.server_learning_rate, spec=spec)
        if self.algorithm == "fedprox":
            return FedProx(tr, self.server_learning_rate, mu=self.prox_mu)
        if self.algorithm == "scaffold":
            return Scaffold(tr, self.server_learning_rate)
        return FedAvg(tr, self.server_learning_rate, local_dp_sgd=self.local_dp_sgd_spec)

    def build_accountant(self) -> FLAccountant | None:
        """None without DP; :class:`~estimator.fl.ftrl.FtrlAccountant` for ``dp_ftrl`` (no sampling credited), else
        :class:`~estimator.fl.dp.ClientLevelAccountant`."""
        if self.clip_norm is None:
            return None
        if isinstance(self.aggregator, DPFTRLSpec):
            return FtrlAccountant(self.aggregator.restart_every, self.delta)
        return ClientLevelAccountant(self.build_sampling(), len(self.clients), self.delta)

    def build_aggregator(self, accountant: FLAccountant | None) -> Aggregator:
        """The stack an in-process run with the same spec uses: ``ValidatingAggregator`` around
        ``FixedClippingDP(WeightedMean(), C, σ, accountant)`` (``fedavg``; without the DP wrapper when
        ``clip_norm`` is None), ``AdaptiveClippingDP(WeightedMean(), C, z, γ, η_C, σ_b, accountant)``,
        ``CoordinateMedian``/``TrimmedMean(WeightedMean(), f)``, ``Krum(WeightedMean(), f, multi)`` or
        ``FLTrust(WeightedMean(), RootTraining(...))`` (``DPFLTrust(RootTraining(...), C, σ, accountant)`` with
        ``"divisor": "expected_clients"``)."""
        return self.aggregator.build(self, accountant)
