"""A device taking part in federated rounds through the collector (numpy and the standard library).

:class:`FLDevice` polls ``GET /v1/fl/tasks/{task}/round?client_id=…``;
when the round selects it, it trains with :func:`~ldp_core.fl.client_round.train_client`,
clips the update to the round's ``clip_norm`` (in float32, as uploaded), and
either uploads it (plain rounds) or walks SecAgg+'s four phases with a
:class:`~ldp_core.fl.secagg.SecAggClient` (advertise keys, send encrypted
shares, send the masked quantized update, reveal shares for the survivors
and dropped clients). SecAgg needs the ``fl`` extra (``cryptography``),
imported only when a round asks for it.

HTTP goes through the SDK uploader's machinery (:mod:`client_sdk.upload.uploader`):
the same pluggable :data:`~client_sdk.upload.uploader.HttpTransport` (``urllib`` by
default), the same full-jitter :class:`~client_sdk.upload.backoff.BackoffPolicy`
and the same ``Retry-After`` parsing (seconds or an HTTP date). Requests are
retried on network errors, 429 and 5xx (honouring ``Retry-After``, plus up to
10 % jitter, at most 5 s by default); a retry sends the same bytes,
whose id is a digest of the content, so the job counts the upload once. A 4xx
answer is not retried: it is counted in :attr:`FLDevice.errors` by its
``error`` reason. Nothing here raises into the host for a network or server
problem; :meth:`FLDevice.step` reports what it did.

``collector_url`` must be https, or plain http on loopback only (the
telemetry client's rule, :func:`client_sdk.urls.check_url`): over plain http
anyone on the path would read the updates and could change the round views a
device trains on. Anything else raises
:class:`~client_sdk.urls.ClientConfigError` when the device is made.
"""

from __future__ import annotations

import base64
import collections
import json
import math
import os
import random
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np

from client_sdk.fl.device_store import FLDeviceStore, canonical_json
from client_sdk.upload.backoff import BackoffPolicy
from client_sdk.upload.uploader import USER_AGENT, HttpRequest, HttpTransport, parse_retry_after, urllib_transport
from client_sdk.urls import check_url
from ldp_core.fl.client_round import train_client
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec, SampleLevelAccountant, local_dp_sgd_from_dict, train_local_dpsgd
from ldp_core.fl.personalization import personalization_from_dict
from ldp_core.fl.protocol import (
    BINARY_CONTENT_TYPE,
    decode_vector,
    encode_upload_binary,
    make_upload,
    model_from_dict,
    sign_upload,
    verify_upload_auth,
)
from ldp_core.fl.training import ClientState, LocalTraining, RoundConfig, clip_to_norm
from ldp_core.randomness import secure_generator

__all__ = ["FLDevice", "HTTPResult", "SampleBudgetExceeded"]

#: The longest wait between two attempts (also for a ``Retry-After`` asking more) when ``backoff`` is a number.
MAX_RETRY_WAIT = 5.0


class SampleBudgetExceeded(FLError):
    """A round under ``local_dp_sgd`` would take the device's sample-level ε past ``max_sample_epsilon``."""


class HTTPResult(NamedTuple):
    """An answer: its status (0 for a network failure) and its body as parsed JSON (or None)."""

    status: int
    body: Any


class FLDevice:
    """One device of task ``task`` with local data (X, y).

    ``rng_for_round(r)`` gives the generator for round r's training and
    quantization (simulations fix it; by default a fresh generator seeded
    from ``os.urandom``). ``random_bytes`` supplies SecAgg secrets.
    ``drop_at`` (simulation of dropouts): the phase from which the device
    stops taking part (e.g. ``"masked"``: it shares keys, then goes away).

    HTTP: ``transport`` sends each request (default ``urllib``); a request is
    tried up to ``max_attempts`` times, the k-th retry after
    ``backoff.delay(k - 1, ...)`` seconds (``U(0, base * 2**(k-1))``), or what a
    ``Retry-After`` asks; a number ``backoff`` means
    ``BackoffPolicy(base=backoff, max_delay=MAX_RETRY_WAIT)``. ``clock`` is
    the wall clock an HTTP-date ``Retry-After`` is measured against.

    ``torch_model`` (a :class:`client_sdk.fl.torch_device.TorchDeviceModel`): train with that PyTorch
    module instead of the numpy model the round names, in plain rounds and under ``local_dp_sgd``
    (spent and accounted as for a numpy model)."""

    def __init__(
        self,
        collector_url: str,
        task: str,
        client_id: str,
        X: np.ndarray,
        y: np.ndarray,
        *,
        rng_for_round: Callable[[int], np.random.Generator] | None = None,
        random_bytes: Callable[[int], bytes] = os.urandom,
        timeout: float = 10.0,
        max_attempts: int = 6,
        backoff: float | BackoffPolicy = 0.1,
        drop_at: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        transport: HttpTransport = urllib_transport,
        clock: Callable[[], float] = time.time,
        identity: Any = None,
        noise_rng_for_round: Callable[[int], np.random.Generator] | None = None,
        dpsgd_noise_rng_for_round: Callable[[int], np.random.Generator] | None = None,
        require_local_dp_sgd: bool = False,
        storage_dir: str | os.PathLike[str] | None = None,
        max_sample_epsilon: float | None = None,
        torch_model: Any = None,
        pinned_authority_key: bytes | None = None,
        min_colluders: int = 0,
        pate_queries: np.ndarray | None = None,
        pate_predict: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> None:
        self.base = check_url(collector_url) + f"/v1/fl/tasks/{urllib.parse.quote(task, safe='')}"
        self.task = task
        self.client_id = client_id
        self.X, self.y = X, y
        self.state = ClientState()
        self.rng_for_round = rng_for_round or (
            lambda r: np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
        )
        self.random_bytes = random_bytes
        #: the generator of round r's distributed-DG rounding and noise share: the OS CSPRNG unless a
        #: simulation fixes it (a server that could predict the noise could subtract it)
        self.noise_rng_for_round = noise_rng_for_round or (lambda r: secure_generator())
        #: the generator of round r's local DP-SGD noise (task option ``local_dp_sgd``): the OS CSPRNG unless a
        #: simulation fixes it; the Poisson batches come from ``rng_for_round(r)``
        self.dpsgd_noise_rng_for_round = dpsgd_noise_rng_for_round or (lambda r: secure_generator())
        #: refuse to train a round whose signed task configuration has no ``local_dp_sgd`` (a device that
        #: insists on sample-level DP; otherwise a server that omits the configuration gets plain SGD updates)
        self.require_local_dp_sgd = require_local_dp_sgd
        if max_sample_epsilon is not None and (
            isinstance(max_sample_epsilon, bool)
            or not isinstance(max_sample_epsilon, (int, float))
            or not math.isfinite(max_sample_epsilon)
            or max_sample_epsilon <= 0
        ):
            raise FLError(f"max_sample_epsilon must be a finite number > 0, got {max_sample_epsilon!r}")
        #: the device's own cap on its sample-level ε for this task (replace-one, at the signed δ): a round
        #: under ``local_dp_sgd`` that would take the ledger past it is refused before training. Set by the
        #: app, never by the server; with ``storage_dir`` it holds across restarts
        self.max_sample_epsilon = None if max_sample_epsilon is None else float(max_sample_epsilon)
        #: the durable store of the ledger and client state (None: in memory only, forgotten on restart)
        self.device_store = None if storage_dir is None else FLDeviceStore(storage_dir)
        #: this device's own sample-level ledger (None until it trains a round under ``local_dp_sgd``);
        #: never uploaded: :meth:`sample_level_privacy` shows it locally. With ``storage_dir`` it is read back
        #: from the store, where each round is committed before its update leaves the device
        self.sample_accountant: SampleLevelAccountant | None = (
            None if self.device_store is None else self.device_store.ledger(task)
        )
        self._state_key: str | None = None
        self._settings: dict[str, Any] | None = None
        stored = None if self.device_store is None else self.device_store.last_round(task)
        #: the last round this device trained (from the store after a restart): a restarted device does not
        #: train the round it already trained and uploaded before the restart
        self._trained_round: int | None = None if stored is None else stored[1].get("round")
        self._global: np.ndarray | None = None
        self.timeout = timeout
        self.max_attempts = max_attempts
        self.backoff = (
            backoff
            if isinstance(backoff, BackoffPolicy)
            else BackoffPolicy(base=backoff, max_delay=max(MAX_RETRY_WAIT, backoff))
        )
        self.transport = transport
        self.clock = clock
        self.drop_at = drop_at
        self.sleep = sleep
        if identity is not None and identity.device_id != client_id:
            raise FLError(f"the identity is enrolled as {identity.device_id!r}, not {client_id!r}")
        if pinned_authority_key is not None and (
            not isinstance(pinned_authority_key, bytes) or len(pinned_authority_key) != 32
        ):
            raise FLError("pinned_authority_key must be the 32-byte Ed25519 public key of the enrollment authority")
        if pinned_authority_key is not None and identity is not None and identity.authority_key != pinned_authority_key:
            raise FLError("the identity was issued by another enrollment authority than the one this device pins")
        #: the enrollment authority this app pins (its configuration, never the server's word): every task
        #: signature and every neighbour's credential must verify under it. Pin an authority the server
        #: operator does not hold, and the operator cannot mint neighbours (docs/fl/SECAGG.md)
        self.pinned_authority_key = pinned_authority_key
        if isinstance(min_colluders, bool) or not isinstance(min_colluders, int) or min_colluders < 0:
            raise FLError(f"min_colluders must be an integer >= 0, got {min_colluders!r}")
        #: the fewest colluding share holders this device insists a SecAgg task withstands, whatever the
        #: signed task states (the device takes max(signed max_colluders, this))
        self.min_colluders = min_colluders
        #: why the last round was refused or failed (errors counts by reason; this keeps the message)
        self.last_error: str | None = None
        #: the device's :class:`ldp_core.tokens.enrollment.DeviceIdentity`: signs every request and upload
        self.identity = identity
        self.errors: collections.Counter[str] = collections.Counter()
        self.uploads = 0
        self.retries = 0
        self.quantized: dict[int, np.ndarray] = {}
        self._jitter = random.Random(int.from_bytes(os.urandom(8), "little"))
        self._done: set[tuple[int, str]] = set()
        self._round: dict[str, Any] = {}
        #: the round view :meth:`step` fetched last (None before the first, or when the collector did not answer)
        self.last_view: dict[str, Any] | None = None
        self._model_key: str | None = None
        self._model: Any = None
        #: a :class:`client_sdk.fl.torch_device.TorchDeviceModel` to train with PyTorch (None: the numpy model
        #: the round names); it serves only rounds whose task model is the one it stands for
        self.torch_model = torch_model
        #: a PATE teacher (:mod:`ldp_core.fl.pate`): the public queries it votes on (their digest must be the
        #: signed task's); such a device uploads nothing but masked vote vectors, in SecAgg rounds of a signed
        #: PATE task, and refuses every other round (a plain round would carry its trained model in the clear)
        self.pate_queries = None if pate_queries is None else np.asarray(pate_queries, np.float32)
        #: the teacher's own model as a function of the queries (None: train the task's model on (X, y))
        self.pate_predict = pate_predict
        if pate_predict is not None and pate_queries is None:
            raise FLError("pate_predict needs pate_queries (the public queries the teacher votes on)")

    # -- HTTP -------------------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        content_type: str = "application/json",
        sign: bool = False,
    ) -> HTTPResult:
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type
        last = HTTPResult(0, None)
        for attempt in range(max(1, self.max_attempts)):
            retry_after = None
            if sign and self.identity is not None:  # a fresh timestamp and nonce per attempt
                parts = urllib.parse.urlsplit(url)
                target = parts.path + ("?" + parts.query if parts.query else "")
                headers.update(self.identity.sign_request(method, target, body or b"", now=self.clock()))
            try:
                resp = self.transport(HttpRequest(method, url, body, headers, self.timeout))
            except OSError:  # refused, reset, timed out, unreachable
                last = HTTPResult(0, None)
            else:
                if resp.status != 429 and resp.status < 500:
                    return HTTPResult(resp.status, _json(resp.body))
                retry_after = parse_retry_after(resp.header("Retry-After"), self.clock())
                last = HTTPResult(resp.status, _json(resp.body))
            if attempt + 1 < self.max_attempts:
                self.retries += 1
                self.sleep(self.backoff.delay(attempt, self._jitter, retry_after))
        return last

    def fetch(self) -> dict[str, Any] | None:
        """The current round as the collector shows it to this device, or None if unavailable."""
        r = self._request(
            "GET", f"{self.base}/round?client_id={urllib.parse.quote(self.client_id, safe='')}", sign=True
        )
        if r.status != 200 or not isinstance(r.body, dict):
            self.errors["fetch_" + str(r.status)] += 1
            return None
        return r.body

    def _upload(self, round: int, kind: str, payload: Mapping[str, Any]) -> bool:
        u = make_upload(self.task, round, kind, self.client_id, payload)
        if self.identity is not None:
            u = sign_upload(u, self.identity)
        r = self._request("POST", f"{self.base}/uploads", encode_upload_binary(u), BINARY_CONTENT_TYPE)
        if r.status == 202:
            self.uploads += 1
            return True
        reason = r.body.get("error", str(r.status)) if isinstance(r.body, dict) else str(r.status)
        self.errors[reason] += 1
        return False

    # -- rounds -----------------------------------------------------------------------------------
    def _model_for(self, view: Mapping[str, Any]) -> Any:
        key = json.dumps(view["model"], sort_keys=True)
        if key != self._model_key:
            self._model, self._model_key = model_from_dict(view["model"]), key
        return self._model

    def _train(self, view: Mapping[str, Any]) -> tuple[np.ndarray, int, np.random.Generator]:
        r = int(view["round"])
        n = int(view["num_params"])
        control = None if view.get("control") is None else decode_vector(view["control"], n, what="control")
        config = RoundConfig(
            r,
            decode_vector(view["params"], n, what="params"),
            view["algorithm"],
            LocalTraining(**view["training"]),
            float(view["prox_mu"]),
            control,
            personalization_from_dict(view.get("personalization")),
        )
        rng = self.rng_for_round(r)
        dp = self._signed_local_dp_sgd(view)
        if dp is not None:  # sample-level DP: DP-SGD on this device, accounted here (ldp_core.fl.local_dpsgd)
            spec, sample_delta = dp
            model, train = self._local_dpsgd_trainer(view)  # a model it cannot train is refused before spending
            self._spend_sample_level(r, spec, sample_delta)  # refused past the cap; committed before training
            noise_rng = self.dpsgd_noise_rng_for_round(r)
            self._load_state(view)
            up = train(model, config, self.X, self.y, spec, rng, noise_rng, self.client_id)
        else:
            self._load_state(view)
            up = train_client(self._training_model(view), config, self.X, self.y, rng, self.client_id, self.state)
        self._save_state(view, config.params)  # before the update leaves: a restart resumes from this state
        delta = up.delta
        if view.get("clip_norm") is not None:
            delta, _ = clip_to_norm(delta, float(view["clip_norm"]))
        return np.asarray(delta, np.float32), up.num_examples, rng

    def _training_model(self, view: Mapping[str, Any]) -> Any:
        """The model this device trains the round's task model with: the numpy one, or its torch module."""
        return self._model_for(view) if self.torch_model is None else self.torch_model.for_view(view["model"])

    def _local_dpsgd_trainer(self, view: Mapping[str, Any]) -> tuple[Any, Callable[..., Any]]:
        """The model and DP-SGD round function: numpy's, or the torch module's (imported only then)."""
        if self.torch_model is None:
            return self._training_model(view), train_local_dpsgd
        from client_sdk.fl.torch_device import train_torch_local_dpsgd

        return self._training_model(view), train_torch_local_dpsgd

    def step(self) -> str:
        """Fetch the round and do this device's next action in it. Returns what happened:
        ``"unavailable"``, ``"done"`` (the task ended), ``"idle"``, ``"dropped"``, or the kind uploaded
        (``"update"``, ``"advert"``, ``"shares"``, ``"masked"``, ``"reveal"``), or ``"failed"``."""
        view = self.fetch()
        self.last_view = view
        if view is None:
            return "unavailable"
        if view["phase"] == "done":
            return "done"
        r, phase = int(view["round"]), str(view["phase"])
        if not view.get("selected") or (r, phase) in self._done:
            return "idle"
        if phase in ("train", "masked") and r == self._trained_round:  # trained before a restart
            return "idle"
        if self.drop_at is not None and _PHASES.index(phase) >= _PHASES.index(self.drop_at):
            return "dropped"
        try:
            kind = self._act(view, r, phase)
        except FLError as exc:
            self.errors[getattr(exc, "reason", type(exc).__name__)] += 1
            self.last_error = str(exc)
            self._done.add((r, phase))
            return "failed"
        self._done.add((r, phase))
        return kind

    def _act(self, view: Mapping[str, Any], r: int, phase: str) -> str:
        if self.pate_queries is not None and (phase == "train" or view.get("secagg") is None):
            raise FLError("a PATE teacher uploads only masked votes: it refuses a round without secure aggregation")
        if phase == "train":
            delta, n, _ = self._train(view)
            return "update" if self._upload(r, "update", {"vector": delta, "num_examples": n}) else "failed"
        from ldp_core.fl.secagg import Quantizer, SecAggClient, SecAggConfig

        sa = view["secagg"]
        if phase == "advertise":
            cfg = SecAggConfig(
                r,
                int(sa["num_clients"]),
                {int(u): tuple(vs) for u, vs in sa["neighbors"].items()},
                int(sa["threshold"]),
                int(sa["vector_length"]),
            )
            t_signed, colluders, task_clients = self._signed_secagg(view)
            client = SecAggClient(int(view["index"]), cfg, self.random_bytes, t_signed, colluders)
            self._round = {
                "round": r,
                "task_clients": task_clients,
                "client": client,
                "ddg": self._signed_ddg(view, sa),
                "compression": self._signed_compression(view, sa),
            }
            a = client.advertise_keys()
            ok = self._upload(r, "advert", {"share_key": a.share_key, "mask_key": a.mask_key})
            return "advert" if ok else "failed"
        if self._round.get("round") != r:
            raise FLError(f"round {r} is past its key-advertising phase and this device holds no keys for it")
        client = self._round["client"]
        if phase == "share":
            cts = client.share_keys(self._verified_adverts(view, r))
            payload = {"ciphertexts": cts, "commitments": dict(client.commitments)}
            return "shares" if self._upload(r, "shares", payload) else "failed"
        if phase == "masked" and (self.pate_queries is not None or "pate" in sa):
            y = client.masked_input(self._pate_votes(view, r, sa), inbox_of(view))
            return "masked" if self._upload(r, "masked", {"vector": y}) else "failed"
        if phase == "masked":
            delta, _, rng = self._train(view)
            inbox = {int(u): base64.b64decode(ct) for u, ct in view["inbox"].items()}
            ddg = self._round.get("ddg")
            comp = self._round.get("compression")
            if ddg is not None:  # this device adds its own noise share before masking (ldp_core.fl.ddg)
                q = ddg.encode(delta, self.noise_rng_for_round(r), int(sa["ddg"]["rotation_seed"]))
                y = client.masked_input(q, inbox, bits=ddg.bits)
            elif comp is not None:  # b-bit codes of the clipped update or of its clipped sketch, in Z_{2^ring_bits}
                if int(sa["vector_length"]) != comp.length(delta.size):
                    raise FLError("the round's vector length differs from the signed compression's")
                q = comp.encode(delta, int(sa["compression"]["rotation_seed"]), self.noise_rng_for_round(r))
                y = client.masked_input(q, inbox, bits=comp.ring_bits)
            else:
                q = Quantizer(float(sa["clip_range"]), float(sa["scale"]), int(sa["max_clients"])).quantize(delta, rng)
                y = client.masked_input(q, inbox)
            self.quantized[r] = q
            # a compressed round's words travel packed, ring_bits each (ldp_core.fl.protocol.pack_words)
            payload = {"vector": y} if comp is None else {"vector": y, "ring_bits": comp.ring_bits}
            return "masked" if self._upload(r, "masked", payload) else "failed"
        if phase == "consistency":
            from ldp_core.fl.secagg import SURVIVORS_TAG

            identity = self.identity
            assert identity is not None  # checked at the advertise phase
            sig = client.sign_survivors(set(view["survivors"]), lambda m: identity.sign(SURVIVORS_TAG, m), self.task)
            return "consistency" if self._upload(r, "consistency", {"signature": sig}) else "failed"
        if phase == "unmask":
            peer_ids, peer_keys = self._round.get("peer_ids", {}), self._round.get("peer_keys", {})
            sigs = {}
            for u, c in (view.get("consistency") or {}).items():
                if (
                    isinstance(c, Mapping)
                    and c.get("client_id") == peer_ids.get(int(u))
                    and isinstance(c.get("signature"), str)
                ):
                    sigs[int(u)] = base64.b64decode(c["signature"])
            out = client.unmask(set(view["survivors"]), set(view["dropped"]), sigs, peer_keys, self.task)
            shares = {v: (kind, s.x, s.y, s.threshold) for v, (kind, s) in out.items()}
            return "reveal" if self._upload(r, "reveal", {"shares": shares}) else "failed"
        raise FLError(f"unknown phase {phase!r}")

    def _pate_votes(self, view: Mapping[str, Any], r: int, sa: Mapping[str, Any]) -> np.ndarray:
        """This teacher's vote vector for round ``r`` (:mod:`ldp_core.fl.pate`): checked against the signed
        task configuration (its PATE object, the queries' digest, the vector length), plus its noise share
        when the signed task adds the noise on the devices."""
        from ldp_core.fl.pate import PateTaskSpec, noise_share, one_hot_votes, queries_digest, teacher_predictions

        signed = view["task_config"]["config"].get("pate")  # verified at the advertise phase
        if self.pate_queries is None or signed is None or "pate" not in sa:
            raise FLError("a PATE round needs a teacher device (pate_queries) and a signed PATE task")
        pate = PateTaskSpec.from_dict(signed)
        queries = self.pate_queries
        if queries.shape[0] != pate.queries or queries_digest(queries) != pate.queries_sha256:
            raise FLError("this teacher's public queries are not the ones the signed PATE task names (their digest)")
        if int(sa["vector_length"]) != pate.length:
            raise FLError("the round's vector length differs from the signed PATE task's queries × classes")
        if self.pate_predict is not None:
            pred = np.asarray(self.pate_predict(queries), np.int64)
        else:
            pred = teacher_predictions(view["model"], view["training"], self.X, self.y, queries, self.rng_for_round(r))
        votes = one_hot_votes(pred, pate.classes)
        if pate.noise == "distributed":  # this device's share of GNMax's noise, before masking (KLS21)
            from ldp_core.noise import discrete_gaussian

            n = len(view["task_config"]["config"]["clients"])  # the signed client set, never the server's count
            z = discrete_gaussian(noise_share(pate.sigma, n), votes.size, self.noise_rng_for_round(r))
            votes = (votes.astype(np.int64) + z).astype(np.int64).astype(np.uint32)  # two's complement mod 2^32
        self.quantized[r] = votes
        return votes

    def _signed_local_dp_sgd(self, view: Mapping[str, Any]) -> tuple[LocalDPSGDSpec, float] | None:
        """The ``local_dp_sgd`` spec and δ of the round's signed task configuration, or None (plain local SGD).
        A configuration that names ``local_dp_sgd`` is used only if this device's enrollment authority signed
        it for this task; with :attr:`require_local_dp_sgd`, or once the device's ledger holds a round of the
        task (it survives restarts with ``storage_dir``), a round without one is refused."""
        tc = view.get("task_config")
        cfg = tc.get("config") if isinstance(tc, Mapping) else None
        if not (isinstance(cfg, Mapping) and cfg.get("local_dp_sgd") is not None):
            if self.require_local_dp_sgd:
                raise FLError("the round's signed task configuration has no local_dp_sgd, which this device requires")
            if self.sample_accountant is not None:  # no downgrade: the task was signed with it before
                raise FLError(
                    f"this device trained rounds of task {self.task!r} under a signed local_dp_sgd; a round "
                    "without it would release its data without sample-level DP"
                )
            return None
        from ldp_core.tokens.enrollment import verify_document

        assert isinstance(tc, Mapping)
        if self.identity is None:
            raise FLError("local_dp_sgd needs an enrolled device (FLDevice(identity=...)) to check its signature")
        sig = tc.get("signature")
        try:
            raw = base64.b64decode(sig) if isinstance(sig, str) else None
        except ValueError:
            raw = None
        ok = raw is not None and verify_document(self.authority_key, cfg, raw) and cfg.get("task") == self.task
        if not ok:
            raise FLError("the round's local_dp_sgd is not signed by this device's enrollment authority")
        opts = dict(cfg["local_dp_sgd"])
        delta = opts.pop("delta", None)
        spec = local_dp_sgd_from_dict(opts)
        assert spec is not None
        if not (isinstance(delta, (int, float)) and 0 < delta < 1):
            raise FLError(f"the signed local_dp_sgd has no usable delta, got {delta!r}")
        return spec, float(delta)

    def _spend_sample_level(self, r: int, spec: LocalDPSGDSpec, delta: float) -> None:
        """Check round r against the ledger and the cap, then record it (durably first, with a store)."""
        acc = self.sample_accountant
        if acc is not None and r in acc.recorded_rounds:
            raise FLError(
                f"round {r} was already trained under local_dp_sgd; a second update would be a second release"
            )
        if acc is not None and delta != acc.delta:
            raise FLError(f"the signed local_dp_sgd delta changed from {acc.delta} to {delta}; the task fixes it")
        after = (acc if acc is not None else SampleLevelAccountant(delta)).with_round(r, spec)
        if self.max_sample_epsilon is not None:
            eps = after.epsilon()
            if eps > self.max_sample_epsilon:
                raise SampleBudgetExceeded(
                    f"round {r} would take this device's sample-level epsilon to {eps:.4g}, past its cap "
                    f"max_sample_epsilon={self.max_sample_epsilon:g} (at delta={after.delta:g}); not training it"
                )
        if self.device_store is not None:
            self.device_store.record_round(self.task, r, spec, delta)
        self.sample_accountant = after

    # -- client state (SCAFFOLD, Ditto, MOON) --------------------------------------------------------
    def _load_state(self, view: Mapping[str, Any]) -> None:
        key = canonical_json(view["model"])
        if key == self._state_key:
            return
        if self.device_store is not None:
            self.state = self.device_store.load_state(self.task, key)
        elif self._state_key is not None:  # the task's model changed: its old state does not apply
            self.state = ClientState()
        self._state_key = key

    def _settings_of(self, view: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "model": view["model"],
            "training": dict(view["training"]),
            "personalization": view.get("personalization"),
            "round": int(view["round"]),
        }

    def _save_state(self, view: Mapping[str, Any], global_params: np.ndarray) -> None:
        self._settings = self._settings_of(view)
        self._trained_round = self._settings["round"]
        self._global = np.asarray(global_params, np.float32).copy()
        if self.device_store is not None:
            assert self._state_key is not None
            self.device_store.save_state(self.task, self._state_key, self.state, self._global, self._settings)

    def personalized_params(self, rng: np.random.Generator | None = None) -> np.ndarray | None:
        """The parameters the app should predict with, after the last round this device trained (also after a
        restart, with ``storage_dir``): Ditto's personal model v_k, Per-FedAvg's global model after its
        fine-tuning steps on the local data (drawn from ``rng``, default the OS CSPRNG), MOON's and plain
        tasks' global model. None before the device trained any round of a task without ``local_dp_sgd``."""
        from ldp_core.fl.personalized_training import personalized_params

        last = None
        if self._settings is not None:
            assert self._state_key is not None
            assert self._global is not None
            last = (self._state_key, self._settings, self._global)
        elif self.device_store is not None:
            last = self.device_store.last_round(self.task)
            if last is not None:
                self._state_key = None  # reload the state that goes with the stored round
                self._load_state(last[1])
        if last is None:
            return None
        _, settings, global_params = last
        return np.asarray(
            personalized_params(
                self._model_for(settings),
                personalization_from_dict(settings.get("personalization")),
                global_params,
                self.state,
                self.X,
                self.y,
                LocalTraining(**settings["training"]),
                rng if rng is not None else secure_generator(),
            )
        )

    def close(self) -> None:
        """Close the device's store (nothing to do without one)."""
        if self.device_store is not None:
            self.device_store.close()

    def __enter__(self) -> FLDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sample_level_privacy(self) -> dict[str, Any] | None:
        """This device's own sample-level ε (rounds it trained under ``local_dp_sgd``; replace-one PLD), for local
        display only; None if it never trained under it."""
        return None if self.sample_accountant is None else self.sample_accountant.report()

    @property
    def authority_key(self) -> bytes:
        """The key every task signature and credential must verify under: the pinned one, else the identity's."""
        if self.pinned_authority_key is not None:
            return self.pinned_authority_key
        assert self.identity is not None
        return bytes(self.identity.authority_key)

    def _signed_secagg(self, view: Mapping[str, Any]) -> tuple[int | None, int, frozenset[str]]:
        """t (None if the task fixes none), the collusion bound c and the client set of the task
        configuration the enrollment authority signed; a SecAgg round without a valid signed configuration for
        this task, or one that names no client set, is refused. c is the larger of the signed ``max_colluders``
        (0 when absent) and this device's own :attr:`min_colluders`."""
        from ldp_core.tokens.enrollment import verify_document

        tc = view.get("task_config")
        if self.identity is None:
            raise FLError("secure aggregation needs an enrolled device (FLDevice(identity=...))")
        ok = isinstance(tc, Mapping) and isinstance(tc.get("config"), Mapping) and isinstance(tc.get("signature"), str)
        if ok:
            assert isinstance(tc, Mapping)
            cfg = tc["config"]
            ok = (
                verify_document(self.authority_key, cfg, base64.b64decode(tc["signature"]))
                and cfg.get("task") == self.task
                and cfg.get("secagg") is True
            )
        if not ok:
            raise FLError("the round's task configuration is not signed by this device's enrollment authority")
        cfg = tc["config"]  # type: ignore[index]
        clients = cfg.get("clients")
        if not isinstance(clients, list) or not all(isinstance(c, str) for c in clients):
            raise FLError("the signed task configuration names no client set: re-sign the task (ldp fl sign-task)")
        c = cfg.get("max_colluders", 0)
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise FLError(f"the signed max_colluders must be an integer >= 0, got {c!r}")
        t = cfg.get("secagg_threshold")
        return (None if t is None else int(t)), max(c, self.min_colluders), frozenset(clients)

    def _signed_threshold(self, view: Mapping[str, Any]) -> int | None:
        """t from the signed task configuration (:meth:`_signed_secagg`)."""
        return self._signed_secagg(view)[0]

    def _signed_ddg(self, view: Mapping[str, Any], sa: Mapping[str, Any]) -> Any:
        """The distributed-DG spec of the signed task configuration (checked by :meth:`_signed_threshold`),
        or None for central noise. Every parameter of the noise share comes from the signed document, none
        from the server; a round that asks for the other kind of noise than the task fixes is refused (a
        server that drops ``ddg`` from the round would otherwise receive un-noised inputs)."""
        from ldp_core.fl.ddg import DDGSpec
        from ldp_core.fl.errors import SecAggError

        signed = view["task_config"]["config"].get("ddg")
        if (signed is None) != (sa.get("ddg") is None):
            raise FLError("the round's noise is not the one the signed task configuration fixes")
        if signed is None:
            return None
        try:
            spec = DDGSpec(**{k: v for k, v in signed.items() if k != "min_shares"})
        except (TypeError, SecAggError) as exc:
            raise FLError(f"the signed distributed-DG parameters are unusable: {exc}") from None
        if int(sa["ddg"]["bits"]) != spec.bits or int(sa["vector_length"]) != spec.padded_dim:
            raise FLError("the round's ring or vector length differs from the signed distributed-DG parameters")
        return spec

    def _signed_compression(self, view: Mapping[str, Any], sa: Mapping[str, Any]) -> Any:
        """The compressed-update spec of the signed task configuration, or None; a round whose compression or
        vector length differs from the signed one is refused (a server could otherwise ask for a ring that
        wraps, or for float words where the task fixed codes)."""
        from ldp_core.fl.errors import ModelError
        from ldp_core.fl.ring_sketch import ring_compression_from_signed

        signed = view["task_config"]["config"].get("compression")
        asked = sa.get("compression")
        if (signed is None) != (asked is None):
            raise FLError("the round's compression is not the one the signed task configuration fixes")
        if signed is None:
            return None
        try:
            spec = ring_compression_from_signed(signed)
        except ModelError as exc:
            raise FLError(f"the signed compression parameters are unusable: {exc}") from None
        assert isinstance(asked, Mapping)
        if {k: v for k, v in asked.items() if k != "rotation_seed"} != spec.to_dict():
            raise FLError("the round's compression parameters differ from the signed task configuration's")
        return spec

    def _verified_adverts(self, view: Mapping[str, Any], r: int) -> dict[int, Any]:
        """The neighbours' key adverts whose signatures verify: each signed by an enrolled device (credential
        from this device's authority) for this task and round, one index per device. An advert the server
        made up or swapped is dropped (counted in ``errors["bad_advert"]``), so no share goes to it."""
        from ldp_core.fl.protocol import Upload
        from ldp_core.fl.secagg import KeyAdvert

        if self.identity is None:
            raise FLError("secure aggregation needs an enrolled device (FLDevice(identity=...))")
        auths = view.get("advert_auth") or {}
        out: dict[int, Any] = {}
        ids = {self.client_id}
        task_clients = self._round.get("task_clients")
        for u, (a, b) in view["adverts"].items():
            auth = auths.get(u)
            if not isinstance(auth, Mapping) or not isinstance(auth.get("client_id"), str):
                self.errors["bad_advert"] += 1
                continue
            keys = {"share_key": base64.b64decode(a), "mask_key": base64.b64decode(b)}
            up = make_upload(self.task, r, "advert", auth["client_id"], keys)
            try:
                verify_upload_auth(
                    Upload(up.task, up.round, up.kind, up.client_id, up.upload_id, up.payload, auth),
                    self.authority_key,
                    self.clock(),
                )
            except FLError:
                self.errors["bad_advert"] += 1
                continue
            if task_clients is None or auth["client_id"] not in task_clients:  # a Sybil the task never named
                self.errors["advert_outside_task"] += 1
                continue
            if auth["client_id"] in ids:  # one device behind two indices (or posing as this one)
                self.errors["bad_advert"] += 1
                continue
            ids.add(auth["client_id"])
            out[int(u)] = KeyAdvert(int(u), keys["share_key"], keys["mask_key"])
        self._round["peer_ids"] = {u: auths[str(u)]["client_id"] for u in out}
        # the device keys of the verified neighbours: they check the survivor-set signatures (consistency round)
        from ldp_core.tokens.enrollment import Credential

        self._round["peer_keys"] = {u: Credential.from_dict(auths[str(u)]["credential"]).public_key for u in out}
        return out

    def run(self, *, poll_interval: float = 0.1, timeout: float | None = None) -> int:
        """Take part until the task is done (or ``timeout`` seconds); return the uploads made."""
        end = None if timeout is None else time.monotonic() + timeout
        while end is None or time.monotonic() < end:
            if self.step() == "done":
                break
            self.sleep(poll_interval)
        return self.uploads


_PHASES = ("train", "advertise", "share", "masked", "consistency", "unmask")


def inbox_of(view: Mapping[str, Any]) -> dict[int, bytes]:
    """The round's share ciphertexts addressed to this device, by sender index."""
    return {int(u): base64.b64decode(ct) for u, ct in view["inbox"].items()}


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None
