"""Federated rounds over the pipeline: the messages devices, collector and aggregation job exchange.

Numpy and the standard library only: the device, the collector and the job
parse and check the same messages with the same code.

Encoding (version 1)
--------------------
Every message is one JSON object with ``"version": 1``. Vectors travel as
base64 (RFC 4648, standard alphabet, padded) of their raw **little-endian**
bytes: float32 for model parameters and plain updates, uint32 for masked
SecAgg inputs. A decoder checks the exact byte length (4·d for a vector of
d values) before it looks at a value, and float vectors must be finite.

Round state (job → ``ldp.fl.rounds`` → collector → device)
----------------------------------------------------------
:class:`RoundState`: the task, a sequence number ``seq`` (one per published
state, increasing), the round, its ``phase``, the model description, the
:class:`~ldp_core.fl.training.RoundConfig` fields (params, algorithm, local
training, μ, SCAFFOLD's control variate), the device clip norm, the clients
selected for the round, the phase deadline, SecAgg's public data (graph,
threshold, quantizer, key adverts, routed ciphertexts, survivors/dropped)
and public counters (ε so far, rejections). The collector serves each device
a *view*: everything public plus whether *that* device is selected, its SecAgg
index and its own inbox; never the list of selected clients.

Phases: plain rounds have ``train`` only; SecAgg rounds ``advertise`` →
``share`` → ``masked`` → ``unmask`` (Bonawitz et al. 2017's four rounds).
After the last round the phase is ``done``.

Uploads (device → collector → ``ldp.fl.updates`` → job)
-------------------------------------------------------
:class:`Upload`: task, round, ``kind`` (``update``, ``advert``, ``shares``,
``masked``, ``reveal``; each belongs to one phase), client id, upload id and
the kind's payload. The upload id is a BLAKE2b-128 digest of the content, so a retry
carries the same id and a replay is recognised (:func:`content_digest`).

An upload also has a **binary form** (:func:`encode_upload_binary`, Content-Type
:data:`BINARY_CONTENT_TYPE`), which devices send and the collector publishes:
a :mod:`ldp_core.wire.framing` frame under ``b"LDPU"`` (version 1) whose header is
the JSON form without the payload's ``vector`` and whose payload is the vector's
raw little-endian bytes. A plain or masked update of d values is then 4·d bytes plus
a header of about 200: 1.001× a plaintext float32 upload at d = 10^5, where
base64 in JSON would be 1.34×. The upload id is the same in both forms.

A masked input of a compressed round (the ``compression`` task option, ring
Z_{2^r} with r < 32) is *packed*: its payload declares ``ring_bits`` r and
``length`` D, and the vector is ⌈D·r/8⌉ bytes, word i's bits at stream bits
i·r … i·r + r − 1, least significant first within each byte, the last byte's
padding bits zero (:func:`pack_words`). :func:`parse_upload` checks the byte
count and the padding; :func:`check_upload_against` that r is the signed ring
width (and that no other round's input is packed).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ldp_core.fl.errors import ModelError, UpdateRejected, build_from_fields
from ldp_core.fl.models import MLP, LogisticRegression, Model, SoftmaxRegression
from ldp_core.fl.personalization import personalization_from_dict
from ldp_core.fl.training import LocalTraining, RoundConfig
from ldp_core.wire.framing import has_magic, pack_headed, unpack_headed

__all__ = [
    "PROTOCOL_VERSION",
    "Phase",
    "UploadKind",
    "PHASE_OF_KIND",
    "SECAGG_PHASES",
    "CIPHERTEXT_BYTES",
    "SHARE_Y_BYTES",
    "encode_vector",
    "pack_words",
    "unpack_words",
    "packed_size",
    "decode_vector",
    "model_to_dict",
    "model_from_dict",
    "RoundState",
    "Upload",
    "parse_upload",
    "encode_upload",
    "encode_upload_binary",
    "BINARY_MAGIC",
    "BINARY_CONTENT_TYPE",
    "check_upload_against",
    "content_digest",
    "make_upload",
    "sign_upload",
    "verify_upload_auth",
    "UPLOAD_SIGNATURE_TAG",
    "CONSISTENCY_TAG",
]

PROTOCOL_VERSION = 1
Phase = Literal["train", "advertise", "share", "masked", "consistency", "unmask", "done"]
UploadKind = Literal["update", "advert", "shares", "masked", "consistency", "reveal"]
PHASE_OF_KIND: dict[str, str] = {
    "update": "train",
    "advert": "advertise",
    "shares": "share",
    "masked": "masked",
    "consistency": "consistency",
    "reveal": "unmask",
}
SECAGG_PHASES = ("advertise", "share", "masked", "consistency", "unmask")
#: the domain tag of an upload's signature (over its upload id): ldp_core.tokens.enrollment
UPLOAD_SIGNATURE_TAG = b"ldp-fl-upload-v1"
#: the domain tag of a survivor's signature of the survivor set it was shown (the consistency round)
CONSISTENCY_TAG = b"ldp-secagg-consistency-v1"
#: nonce (12) + AES-GCM of the share pair (148) + tag (16); see ldp_core.fl.secagg.SecAggClient.share_keys
CIPHERTEXT_BYTES = 12 + 148 + 16
#: a Shamir share's y in GF(2^521 − 1), little-endian
SHARE_Y_BYTES = 66
_CLIENT_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_TASK = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


def _bad(reason: str, message: str) -> UpdateRejected:
    return UpdateRejected(reason, message)


#: the tag that starts an upload's binary form (a :mod:`ldp_core.wire.framing` frame, version 1)
BINARY_MAGIC = b"LDPU"
BINARY_CONTENT_TYPE = "application/vnd.ldp.fl-upload"


def encode_vector(v: np.ndarray, dtype: str = "<f4") -> str:
    """base64 of the vector's raw little-endian bytes (``<f4`` or ``<u4``)."""
    return base64.b64encode(np.ascontiguousarray(v, dtype=np.dtype(dtype)).tobytes()).decode("ascii")


def decode_vector(text: object, length: int, dtype: str = "<f4", what: str = "vector") -> np.ndarray:
    """The vector of ``length`` values from base64 ``text`` (or raw little-endian bytes, from the binary
    form); :class:`UpdateRejected` if it is not exactly that.

    ``wrong_shape`` for a length other than 4·``length`` bytes, ``non_finite``
    for NaN/±inf floats, ``malformed`` for text that is not base64."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
    elif not isinstance(text, str):
        raise _bad("malformed", f"{what} must be a base64 string, got {type(text).__name__}")
    elif len(text) != 4 * ((4 * length + 2) // 3):
        n = len(text) * 3 // 4
        raise _bad(
            "wrong_shape",
            f"{what} has about {n // 4} values ({len(text)} base64 characters); "
            f"this round needs exactly {length} ({4 * ((4 * length + 2) // 3)} characters)",
        )
    else:
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("malformed", f"{what} is not valid base64 (standard alphabet, padded)") from None
    if len(raw) != 4 * length:
        raise _bad("wrong_shape", f"{what} has {len(raw)} bytes; this round needs {4 * length} ({length} values)")
    out = np.frombuffer(raw, dtype=np.dtype(dtype)).astype(np.dtype(dtype).newbyteorder("="))
    if out.dtype.kind == "f" and not np.isfinite(out).all():
        raise _bad("non_finite", f"{what} holds NaN or infinite values")
    return out


def packed_size(length: int, bits: int) -> int:
    """⌈length·bits/8⌉: the bytes of ``length`` ring words packed ``bits`` bits each (:func:`pack_words`)."""
    return (length * bits + 7) // 8


def pack_words(words: np.ndarray, bits: int) -> bytes:
    """Ring words of Z_{2^bits} packed ``bits`` bits each: word i's bit k is bit i·bits + k of the stream,
    little-endian bit order within each byte (bit 0 = least significant), the last byte zero-padded.
    ``ValueError`` for a word ≥ 2^bits (it would not survive the packing)."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 32:
        raise ValueError(f"a packed ring word has 1 to 32 bits, got {bits!r}")
    w = np.ascontiguousarray(words, dtype="<u4").ravel()
    if bits < 32 and int(w.max(initial=0)) >> bits:
        raise ValueError(f"a word of {int(w.max())} does not fit Z_(2^{bits})")
    # the words' own bits, least significant first (4 little-endian bytes each), cut to the ring width
    stream = np.unpackbits(w.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")[:, :bits]
    return np.packbits(stream.ravel(), bitorder="little").tobytes()


def unpack_words(raw: bytes, length: int, bits: int, what: str = "the packed vector") -> np.ndarray:
    """The inverse of :func:`pack_words` for ``length`` words (uint32); :class:`UpdateRejected`
    ``wrong_shape`` unless ``raw`` is exactly ⌈length·bits/8⌉ bytes, ``malformed`` if a padding bit of
    the last byte is set (one encoding per vector: the upload id is a digest of the content)."""
    if not 1 <= bits <= 32:
        raise _bad("malformed", f"{what}: a packed ring word has 1 to 32 bits, got {bits}")
    need = packed_size(length, bits)
    if len(raw) != need:
        raise _bad(
            "wrong_shape",
            f"{what} has {len(raw)} bytes; {length} words of {bits} bits are exactly {need} (⌈{length}·{bits}/8⌉)",
        )
    stream = np.unpackbits(np.frombuffer(raw, dtype=np.uint8), bitorder="little")
    if stream[length * bits :].any():
        raise _bad("malformed", f"{what}: padding bits after the {length}·{bits} data bits must be zero")
    full = np.zeros((length, 32), dtype=np.uint8)
    full[:, :bits] = stream[: length * bits].reshape(length, bits)
    return np.packbits(full, axis=1, bitorder="little").view("<u4").ravel().astype(np.uint32)


def _b64_bytes(text: object, size: int, what: str) -> bytes:
    if not isinstance(text, str) or len(text) != 4 * ((size + 2) // 3):
        raise _bad("malformed", f"{what} must be base64 of exactly {size} bytes")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("malformed", f"{what} is not valid base64") from None
    if len(raw) != size:
        raise _bad("malformed", f"{what} must be {size} bytes, got {len(raw)}")
    return raw


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


# -- models -------------------------------------------------------------------------------------
def model_to_dict(model: Model) -> dict[str, Any]:
    """The JSON description of one of the numpy models (what devices build the model from)."""
    if isinstance(model, LogisticRegression):
        return {"kind": "logistic", "n_features": model.n_features, "l2": model.l2}
    if isinstance(model, SoftmaxRegression):
        return {"kind": "softmax", "n_features": model.n_features, "n_classes": model.n_classes, "l2": model.l2}
    if isinstance(model, MLP):
        return {
            "kind": "mlp",
            "n_features": model.n_features,
            "hidden": model.hidden,
            "n_classes": model.n_classes,
            "activation": model.activation,
            "l2": model.l2,
        }
    raise ModelError(f"no JSON description for {type(model).__name__}; use logistic, softmax or mlp")


def model_from_dict(d: Mapping[str, Any]) -> Model:
    """Inverse of :func:`model_to_dict`."""
    if not isinstance(d, Mapping):
        raise ModelError(f"a model description is a JSON object, got {type(d).__name__}")
    kind = d.get("kind")
    args = {k: v for k, v in d.items() if k != "kind"}
    classes: dict[str, type[Model]] = {"logistic": LogisticRegression, "softmax": SoftmaxRegression, "mlp": MLP}
    if kind in classes:
        return build_from_fields(f"model {kind!r}", classes[str(kind)], args, ModelError)
    raise ModelError(f"model kind must be 'logistic', 'softmax' or 'mlp', got {kind!r}")


# -- round state --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RoundState:
    """One published state of a task (see the module docstring).

    ``secagg`` (SecAgg rounds only): ``{"num_clients", "neighbors": {index: [..]},
    "threshold", "vector_length", "clip_range", "scale", "max_clients"}``;
    ``indices`` maps selected client ids to SecAgg indices 1..n; ``adverts``
    (from phase ``share`` on): ``{index: (share_key, mask_key)}``;
    ``inbox`` (phase ``masked``): ``{recipient: {sender: ciphertext}}``;
    ``survivors``/``dropped`` (phase ``unmask``): index sets."""

    task: str
    seq: int
    round: int
    phase: str
    rounds: int
    model: Mapping[str, Any]
    params: np.ndarray
    algorithm: str = "fedavg"
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    prox_mu: float = 0.0
    control: np.ndarray | None = None
    clip_norm: float | None = None
    selected: tuple[str, ...] = ()
    opened_at: float = 0.0
    deadline: float = 0.0
    secagg: Mapping[str, Any] | None = None
    indices: Mapping[str, int] = dataclasses.field(default_factory=dict)
    adverts: Mapping[int, tuple[bytes, bytes]] = dataclasses.field(default_factory=dict)
    inbox: Mapping[int, Mapping[int, bytes]] = dataclasses.field(default_factory=dict)
    survivors: tuple[int, ...] = ()
    dropped: tuple[int, ...] = ()
    stats: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    enrollment_key: bytes | None = None
    task_config: Mapping[str, Any] | None = None
    advert_auth: Mapping[int, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    consistency: Mapping[int, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    personalization: Mapping[str, Any] | None = None

    @property
    def payload_size(self) -> int:
        if self.secagg is not None and "pate" in self.secagg:  # a PATE round: vote vectors of queries × classes
            return int(self.secagg["vector_length"])
        n = int(self.params.shape[0])
        return 2 * n if self.algorithm == "scaffold" else n

    def round_config(self) -> RoundConfig:
        """The :class:`RoundConfig` devices train with."""
        return RoundConfig(
            self.round,
            self.params,
            self.algorithm,  # type: ignore[arg-type]
            LocalTraining(**self.training),
            self.prox_mu,
            self.control,
            personalization_from_dict(self.personalization),
        )

    def _public(self, vec: Any = encode_vector) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "task": self.task,
            "seq": self.seq,
            "round": self.round,
            "phase": self.phase,
            "rounds": self.rounds,
            "model": dict(self.model),
            "params": vec(self.params),
            "num_params": int(self.params.shape[0]),
            "algorithm": self.algorithm,
            "training": dict(self.training),
            "prox_mu": self.prox_mu,
            "control": None if self.control is None else vec(self.control),
            "clip_norm": self.clip_norm,
            "payload_size": self.payload_size,
            "opened_at": self.opened_at,
            "deadline": self.deadline,
            "secure_aggregation": self.secagg is not None,
            "stats": dict(self.stats),
            "enrollment_key": None if self.enrollment_key is None else _b64(self.enrollment_key),
            "task_config": None if self.task_config is None else dict(self.task_config),
        }
        if self.personalization is not None:  # absent otherwise: older readers see the same record
            out["personalization"] = dict(self.personalization)
        return out

    def _full(self, vec: Any) -> dict[str, Any]:
        out = self._public(vec)
        out["secagg"] = None if self.secagg is None else dict(self.secagg)
        out["adverts"] = {str(u): [_b64(a), _b64(b)] for u, (a, b) in sorted(self.adverts.items())}
        out["advert_auth"] = {str(u): dict(a) for u, a in sorted(self.advert_auth.items())}
        out["survivors"] = list(self.survivors)
        out["dropped"] = list(self.dropped)
        out["consistency"] = {str(u): dict(c) for u, c in sorted(self.consistency.items())}
        out["selected"] = list(self.selected)
        out["indices"] = dict(self.indices)
        out["inbox"] = {
            str(v): {str(u): _b64(ct) for u, ct in sorted(per.items())} for v, per in sorted(self.inbox.items())
        }
        return out

    def to_json(self) -> bytes:
        """The full state as one JSON object (vectors in base64): the single-record form of version 1."""
        return json.dumps(self._full(encode_vector), sort_keys=True, separators=(",", ":")).encode()

    def to_document(self) -> dict[str, Any]:
        """The full state with ``params`` and ``control`` as float32 numpy vectors (for
        :func:`pipeline.fl_records.pack_document`: raw little-endian bytes in chunked records)."""
        return self._full(lambda v: np.ascontiguousarray(v, np.float32))

    @classmethod
    def from_document(cls, obj: Mapping[str, Any]) -> RoundState:
        """Inverse of :meth:`to_document` (:class:`ValueError` or :class:`UpdateRejected` if it is not one)."""

        def vec(v: object, n: int, what: str) -> np.ndarray:
            if not isinstance(v, np.ndarray) or v.dtype != np.float32 or v.shape != (n,):
                raise _bad("wrong_shape", f"{what} must be a float32 vector of {n} values")
            if not np.isfinite(v).all():
                raise _bad("non_finite", f"{what} holds NaN or infinite values")
            return v

        return cls._from_obj(dict(obj), vec)

    def public_view(self) -> dict[str, Any]:
        """What anyone may read: the model, the configuration, the phase and its deadline, public counters.
        Nothing in it depends on the round's sample (no realized count, no SecAgg graph, adverts or survivor
        lists: those go to selected devices only, :meth:`view_for`)."""
        return self._public()

    def view_for(self, client_id: str) -> dict[str, Any]:
        """What the collector serves to the *authenticated* device ``client_id``: the public view,
        ``selected``, and for a selected device of a SecAgg round its ``index``, the round's SecAgg
        parameters, its neighbours' adverts (with their signatures), the survivor set it is shown, the
        consistency signatures and its own ``inbox``. Never the sample, nor anyone else's inbox."""
        out = self._public()
        selected = client_id in set(self.selected)
        index = self.indices.get(client_id) if selected else None
        out["selected"] = selected
        out["index"] = index
        out["inbox"] = {}
        if index is None or self.secagg is None:
            return out
        nbrs = {int(v) for v in self.secagg["neighbors"][str(index)]}
        out["secagg"] = dict(self.secagg)
        out["adverts"] = {str(u): [_b64(a), _b64(b)] for u, (a, b) in sorted(self.adverts.items()) if u in nbrs}
        out["advert_auth"] = {str(u): dict(a) for u, a in sorted(self.advert_auth.items()) if u in nbrs}
        out["survivors"] = list(self.survivors)
        out["dropped"] = [u for u in self.dropped if u in nbrs]
        out["consistency"] = {str(u): dict(c) for u, c in sorted(self.consistency.items())}
        out["inbox"] = {str(u): _b64(ct) for u, ct in sorted(self.inbox.get(index, {}).items())}
        return out

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> RoundState:
        """Parse the full record (raises :class:`ValueError` if it is not a version-1 round state)."""
        obj = json.loads(data) if isinstance(data, (bytes, str)) else dict(data)
        return cls._from_obj(obj, lambda v, n, what: decode_vector(v, n, what=what))

    @classmethod
    def _from_obj(cls, obj: Any, vec: Any) -> RoundState:
        if not isinstance(obj, dict) or obj.get("version") != PROTOCOL_VERSION:
            raise ValueError(f"not a version-{PROTOCOL_VERSION} round state")
        n = int(obj["num_params"])
        params = vec(obj["params"], n, "params")
        control = None if obj.get("control") is None else vec(obj["control"], n, "control")
        return cls(
            task=str(obj["task"]),
            seq=int(obj["seq"]),
            round=int(obj["round"]),
            phase=str(obj["phase"]),
            rounds=int(obj["rounds"]),
            model=dict(obj["model"]),
            params=params,
            algorithm=str(obj["algorithm"]),
            training=dict(obj["training"]),
            prox_mu=float(obj["prox_mu"]),
            control=control,
            personalization=None if obj.get("personalization") is None else dict(obj["personalization"]),
            clip_norm=None if obj.get("clip_norm") is None else float(obj["clip_norm"]),
            selected=tuple(obj.get("selected", ())),
            opened_at=float(obj["opened_at"]),
            deadline=float(obj["deadline"]),
            secagg=obj.get("secagg"),
            indices={str(k): int(v) for k, v in obj.get("indices", {}).items()},
            adverts={
                int(u): (base64.b64decode(a), base64.b64decode(b)) for u, (a, b) in obj.get("adverts", {}).items()
            },
            inbox={
                int(v): {int(u): base64.b64decode(ct) for u, ct in per.items()}
                for v, per in obj.get("inbox", {}).items()
            },
            survivors=tuple(int(u) for u in obj.get("survivors", ())),
            dropped=tuple(int(u) for u in obj.get("dropped", ())),
            stats=dict(obj.get("stats", {})),
            enrollment_key=None if obj.get("enrollment_key") is None else base64.b64decode(obj["enrollment_key"]),
            task_config=None if obj.get("task_config") is None else dict(obj["task_config"]),
            advert_auth={int(u): dict(a) for u, a in obj.get("advert_auth", {}).items()},
            consistency={int(u): dict(c) for u, c in obj.get("consistency", {}).items()},
        )


# -- uploads ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Upload:
    """One checked upload. ``payload`` by kind:

    * ``update``: ``{"vector": float32 array, "num_examples": int}``
    * ``advert``: ``{"share_key": 32 bytes, "mask_key": 32 bytes}``
    * ``shares``: ``{"ciphertexts": {recipient index: bytes}}``
    * ``masked``: ``{"vector": uint32 array}``, or in a compressed round ``{"vector": uint32 array,
      "ring_bits": r}``, which travels packed r bits per word (:func:`pack_words`) with its ``length``
    * ``reveal``: ``{"shares": {neighbour index: (kind "b"/"s", x, y, threshold)}}``
    """

    task: str
    round: int
    kind: str
    client_id: str
    upload_id: str
    payload: Mapping[str, Any]
    #: ``{"credential": {...}, "signature": base64}``: the enrolled device's signature of the upload id
    #: (:func:`sign_upload`); outside the content digest, so a retry has the same id
    auth: Mapping[str, Any] | None = None

    @property
    def phase(self) -> str:
        return PHASE_OF_KIND[self.kind]


def sign_upload(u: Upload, identity: Any) -> Upload:
    """``u`` signed by ``identity`` (a :class:`ldp_core.tokens.enrollment.DeviceIdentity` of ``u.client_id``):
    Ed25519 over :data:`UPLOAD_SIGNATURE_TAG` and the upload id, which binds task, round, kind, client and
    content, so a signed upload cannot be moved to another round, client or content."""
    sig = identity.sign(UPLOAD_SIGNATURE_TAG, u.upload_id.encode())
    return dataclasses.replace(u, auth={"credential": identity.credential.to_dict(), "signature": _b64(sig)})


def verify_upload_auth(u: Upload, authority_key: bytes | None, now: float | None = None) -> Any:
    """The verified :class:`ldp_core.tokens.enrollment.Credential` of ``u``'s sender, or
    :class:`UpdateRejected` (``unauthenticated``): the credential must be valid under the task's
    ``authority_key``, name ``u.client_id``, and its key must have signed ``u``'s id."""
    from ldp_core.tokens.enrollment import Credential, EnrollmentError, verify_signature

    if authority_key is None:
        raise _bad("unauthenticated", "the task names no enrollment key, so no upload can be authenticated")
    if u.auth is None:
        raise _bad("unauthenticated", f"the upload of {u.client_id!r} is not signed by an enrolled device")
    try:
        cred = Credential.from_dict(u.auth.get("credential"))
        cred.verify([authority_key], now)
    except EnrollmentError as exc:
        raise _bad("unauthenticated", f"the upload's credential: {exc}") from None
    if cred.device_id != u.client_id:
        raise _bad("unauthenticated", f"a credential of {cred.device_id!r} on an upload of {u.client_id!r}")
    sig = u.auth.get("signature")
    try:
        raw = base64.b64decode(sig, validate=True) if isinstance(sig, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if not verify_signature(cred.public_key, raw, UPLOAD_SIGNATURE_TAG, u.upload_id.encode()):
        raise _bad("unauthenticated", f"the signature on the upload of {u.client_id!r} does not verify")
    return cred


def _auth_json(auth: Mapping[str, Any] | None) -> dict[str, Any]:
    return {} if auth is None else {"auth": {"credential": auth.get("credential"), "signature": auth.get("signature")}}


def _parse_auth(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    a = obj.get("auth")
    if a is None:
        return None
    if not isinstance(a, dict) or not isinstance(a.get("credential"), dict) or not isinstance(a.get("signature"), str):
        raise _bad("malformed", "auth must be an object with a credential object and a base64 signature")
    if len(json.dumps(a)) > 4096:
        raise _bad("too_large", "auth is larger than 4096 bytes")
    return {"credential": a["credential"], "signature": a["signature"]}


def content_digest(task: str, round: int, kind: str, client_id: str, payload: Mapping[str, Any]) -> str:
    """The upload id: BLAKE2b-128 over the upload's canonical JSON content (task, round, kind, client,
    payload, including an update's example count), so a retry has the same id and any change a new one."""
    h = hashlib.blake2b(digest_size=16)
    h.update(
        json.dumps(
            [task, int(round), kind, client_id, _payload_json(kind, payload)], sort_keys=True, separators=(",", ":")
        ).encode()
    )
    return h.hexdigest()


def _payload_json(kind: str, p: Mapping[str, Any]) -> dict[str, Any]:
    if kind == "update":
        return {"vector": encode_vector(p["vector"]), "num_examples": int(p["num_examples"])}
    if kind == "advert":
        return {"share_key": _b64(p["share_key"]), "mask_key": _b64(p["mask_key"])}
    if kind == "shares":
        out = {"ciphertexts": {str(v): _b64(ct) for v, ct in sorted(p["ciphertexts"].items())}}
        if "commitments" in p:
            out["commitments"] = {str(v): _b64(c) for v, c in sorted(p["commitments"].items())}
        return out
    if kind == "masked":
        if "ring_bits" in p:  # packed ring words (a compressed round: ldp_core.fl.compress.RingQuantization)
            r = int(p["ring_bits"])
            return {"vector": _b64(pack_words(p["vector"], r)), "ring_bits": r, "length": int(len(p["vector"]))}
        return {"vector": encode_vector(p["vector"], "<u4")}
    if kind == "consistency":
        return {"signature": _b64(p["signature"])}
    if kind == "reveal":
        return {
            "shares": {
                str(v): {"kind": k, "x": int(x), "y": _b64(int(y).to_bytes(SHARE_Y_BYTES, "little")), "t": int(t)}
                for v, (k, x, y, t) in sorted(p["shares"].items())
            }
        }
    raise ValueError(f"unknown upload kind {kind!r}")


def encode_upload(u: Upload) -> bytes:
    """The canonical JSON of an upload (what the device sends and what the collector publishes)."""
    return json.dumps(
        {
            "version": PROTOCOL_VERSION,
            "task": u.task,
            "round": u.round,
            "kind": u.kind,
            "client_id": u.client_id,
            "upload_id": u.upload_id,
            "payload": _payload_json(u.kind, u.payload),
            **_auth_json(u.auth),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def encode_upload_binary(u: Upload) -> bytes:
    """The binary form of an upload (module docstring): header JSON, then an update's or masked input's
    vector as raw little-endian bytes."""
    vector = u.kind in ("update", "masked")
    packed = u.kind == "masked" and "ring_bits" in u.payload
    if not vector:
        payload = _payload_json(u.kind, u.payload)
    elif u.kind == "update":
        payload = {"num_examples": int(u.payload["num_examples"])}
    elif packed:
        payload = {"ring_bits": int(u.payload["ring_bits"]), "length": int(len(u.payload["vector"]))}
    else:
        payload = {}
    header = json.dumps(
        {
            "version": PROTOCOL_VERSION,
            "task": u.task,
            "round": u.round,
            "kind": u.kind,
            "client_id": u.client_id,
            "upload_id": u.upload_id,
            "payload": payload,
            **_auth_json(u.auth),
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    raw = b""
    if packed:
        raw = pack_words(u.payload["vector"], int(u.payload["ring_bits"]))
    elif vector:
        raw = np.ascontiguousarray(u.payload["vector"], dtype="<f4" if u.kind == "update" else "<u4").tobytes()
    return pack_headed(BINARY_MAGIC, header, raw)


def _split_binary(body: bytes) -> dict[str, Any]:
    """Header object of a binary upload, with the vector bytes put in the payload (still to be checked)."""
    head, rest = unpack_headed(body, BINARY_MAGIC, "binary FL upload", error=lambda m: _bad("malformed", m))
    try:
        obj = json.loads(head)
    except (ValueError, RecursionError) as exc:
        raise _bad("malformed", f"the binary upload's header is not JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("payload"), dict):
        raise _bad("malformed", "the binary upload's header must be an object with a payload object")
    if obj.get("kind") in ("update", "masked"):
        if "vector" in obj["payload"]:
            raise _bad("malformed", "a binary upload carries its vector after the header, not in it")
        obj["payload"]["vector"] = rest
    elif len(rest):
        raise _bad(
            "malformed",
            f"{len(rest)} bytes follow the header of a {str(obj.get('kind'))[:20]!r} upload, which has no vector",
        )
    return obj


def _int(obj: Mapping[str, Any], name: str, low: int = 0, high: int = 2**62) -> int:
    v = obj.get(name)
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise _bad("malformed", f"{name!r} must be an integer in [{low}, {high}], got {str(v)[:40]!r}")
    return v


def _index_map(obj: object, what: str, limit: int) -> dict[int, Any]:
    if not isinstance(obj, dict):
        raise _bad("malformed", f"{what} must be a JSON object keyed by client index")
    if len(obj) > limit:
        raise _bad("too_large", f"{what} has {len(obj)} entries; at most {limit}")
    out = {}
    for k, v in obj.items():
        if not (isinstance(k, str) and k.isdigit() and 0 < int(k) < 2**31):
            raise _bad("malformed", f"{what}: key {k[:20]!r} is not a client index")
        out[int(k)] = v
    return out


def _unpacked_masked(p: Mapping[str, Any], payload_size: int, padded: int) -> np.ndarray:
    """A masked input as uint32 words (4 bytes each) of the round's length, or of its power-of-two padding
    (a distributed-discrete-Gaussian round rotates a padded update: ldp_core.fl.ddg)."""
    try:
        return decode_vector(p.get("vector"), payload_size, "<u4", "the masked input")
    except UpdateRejected:
        if padded == payload_size:
            raise
        return decode_vector(p.get("vector"), padded, "<u4", "the masked input")


def _packed_masked(p: Mapping[str, Any], lengths: tuple[int, int]) -> dict[str, Any]:
    """A masked input packed ``ring_bits`` bits per word (:func:`pack_words`), ``length`` words: the
    declared length at most the update's power-of-two padding (a count sketch masks fewer words than the
    update has), the bytes exactly ⌈length·ring_bits/8⌉ and the padding bits zero. Whether the length and
    width are the round's signed ones is :func:`check_upload_against`'s."""
    r = _int(p, "ring_bits", 1, 32)
    n = _int(p, "length", 1, 2**31)
    if n > max(lengths):
        raise _bad(
            "wrong_shape", f"the masked input declares {n} words; no round of this task masks more than {max(lengths)}"
        )
    text = p.get("vector")
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
    elif isinstance(text, str):
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("malformed", "the masked input is not valid base64 (standard alphabet, padded)") from None
    else:
        raise _bad("malformed", f"the masked input must be base64 or raw bytes, got {type(text).__name__}")
    return {"vector": unpack_words(raw, n, r, "the packed masked input"), "ring_bits": r}


def parse_upload(
    body: bytes | Mapping[str, Any], *, payload_size: int | None = None, max_neighbors: int = 4096
) -> Upload:
    """Decode and check an upload's form (JSON, or the binary form, recognised by :data:`BINARY_MAGIC`);
    :class:`UpdateRejected` says what is wrong.

    Checks that need no round state: the version, field types, the client id
    and task patterns, base64 and byte lengths (``payload_size`` values for
    vectors, when given), finiteness, and that ``upload_id`` matches the
    content. Reasons: ``malformed``, ``unsupported_version``, ``wrong_shape``,
    ``non_finite``, ``bad_weight``, ``upload_id_mismatch``, ``too_large``."""
    obj: Any
    if isinstance(body, (bytes, bytearray, memoryview)) and has_magic(body, BINARY_MAGIC):
        obj = _split_binary(bytes(body))
    elif isinstance(body, (bytes, bytearray, memoryview)):
        try:
            obj = json.loads(bytes(body))
        except (ValueError, RecursionError) as exc:
            raise _bad("malformed", f"the body is not JSON: {str(exc)[:120]}") from None
    else:
        obj = body
    if not isinstance(obj, dict):
        raise _bad("malformed", "an upload is a JSON object")
    if obj.get("version") != PROTOCOL_VERSION:
        raise _bad("unsupported_version", f"version must be {PROTOCOL_VERSION}, got {str(obj.get('version'))[:20]!r}")
    task, client_id, kind, upload_id = obj.get("task"), obj.get("client_id"), obj.get("kind"), obj.get("upload_id")
    if not isinstance(task, str) or not _TASK.match(task):
        raise _bad("malformed", "task must be 1-64 characters from letters, digits, '_', '.', '-'")
    if not isinstance(client_id, str) or not _CLIENT_ID.match(client_id):
        raise _bad("malformed", "client_id must be 1-128 characters from letters, digits, '_', '.', ':', '-'")
    if kind not in PHASE_OF_KIND:
        raise _bad("malformed", f"kind must be one of {sorted(PHASE_OF_KIND)}, got {str(kind)[:30]!r}")
    if not isinstance(upload_id, str) or not _HEX32.match(upload_id):
        raise _bad("malformed", "upload_id must be 32 lowercase hex digits")
    rnd = _int(obj, "round")
    p = obj.get("payload")
    if not isinstance(p, dict):
        raise _bad("malformed", "payload must be a JSON object")
    payload: dict[str, Any]
    if kind in ("update", "masked"):
        if payload_size is None:
            raise _bad("malformed", "the vector length of this round is unknown")
        if kind == "update":
            ne = p.get("num_examples")
            if isinstance(ne, bool) or not isinstance(ne, int) or not 0 <= ne < 2**53:
                raise _bad("bad_weight", f"num_examples must be an integer >= 0, got {str(ne)[:30]!r}")
            payload = {
                "vector": decode_vector(p.get("vector"), payload_size, "<f4", "the update vector"),
                "num_examples": ne,
            }
        else:
            # a distributed-discrete-Gaussian round masks the update padded to a power of two (ldp_core.fl.ddg);
            # check_upload_against holds the length to the round's own
            padded = 1 << (payload_size - 1).bit_length() if payload_size > 0 else payload_size
            if "ring_bits" in p or "length" in p:  # packed ring words; the width is held to the round's later
                payload = _packed_masked(p, (payload_size, padded))
            else:
                payload = {"vector": _unpacked_masked(p, payload_size, padded)}
    elif kind == "advert":
        payload = {
            "share_key": _b64_bytes(p.get("share_key"), 32, "share_key"),
            "mask_key": _b64_bytes(p.get("mask_key"), 32, "mask_key"),
        }
    elif kind == "shares":
        cts = _index_map(p.get("ciphertexts"), "ciphertexts", max_neighbors)
        payload = {"ciphertexts": {v: _b64_bytes(ct, CIPHERTEXT_BYTES, f"ciphertext for {v}") for v, ct in cts.items()}}
        if "commitments" in p:
            cms = _index_map(p.get("commitments"), "commitments", max_neighbors)
            payload["commitments"] = {v: _b64_bytes(c, 64, f"commitment for {v}") for v, c in cms.items()}
    elif kind == "consistency":
        payload = {"signature": _b64_bytes(p.get("signature"), 64, "signature")}
    else:
        shares = _index_map(p.get("shares"), "shares", max_neighbors)
        out = {}
        for v, s in shares.items():
            if not isinstance(s, dict) or s.get("kind") not in ("b", "s"):
                raise _bad("malformed", f"share of {v}: kind must be 'b' or 's'")
            y = int.from_bytes(_b64_bytes(s.get("y"), SHARE_Y_BYTES, f"share of {v}"), "little")
            out[v] = (s["kind"], _int(s, "x", 1, 2**31), y, _int(s, "t", 1, 2**31))
        payload = {"shares": out}
    expected = content_digest(task, rnd, kind, client_id, payload)
    if upload_id != expected:
        raise _bad(
            "upload_id_mismatch",
            f"upload_id {upload_id} does not match the content (expected {expected}); "
            "compute it with ldp_core.fl.protocol (BLAKE2b-128 of the content)",
        )
    return Upload(task, rnd, kind, client_id, upload_id, payload, _parse_auth(obj))


def make_upload(task: str, round: int, kind: str, client_id: str, payload: Mapping[str, Any]) -> Upload:
    """An upload with its content-derived id."""
    return Upload(task, round, kind, client_id, content_digest(task, round, kind, client_id, payload), dict(payload))


def check_upload_against(u: Upload, state: RoundState) -> None:
    """The checks that need the round state (shared by the collector and the job).

    ``stale_round`` (another round), ``wrong_phase`` (the round is in another
    phase), ``not_selected`` (the client is not in the round's sample), and
    for SecAgg kinds ``bad_secagg`` (addresses or share points outside the
    client's neighbourhood)."""
    if u.round != state.round:
        raise _bad(
            "stale_round",
            f"the upload is for round {u.round}; the current round is {state.round}"
            + (" (the task is done)" if state.phase == "done" else ""),
        )
    if u.phase != state.phase:
        raise _bad(
            "wrong_phase",
            f"a {u.kind!r} upload belongs to phase {u.phase!r}; round {state.round} is in phase {state.phase!r}",
        )
    if u.client_id not in set(state.selected):
        raise _bad("not_selected", f"client {u.client_id!r} is not selected for round {state.round}")
    if state.secagg is None:
        return
    me = state.indices[u.client_id]
    nbrs = set(int(v) for v in state.secagg["neighbors"][str(me)])
    if u.kind == "shares":
        if "commitments" in u.payload and set(u.payload["commitments"]) != set(u.payload["ciphertexts"]):
            raise _bad("bad_secagg", "the share commitments must name exactly the share recipients")
        bad = [v for v in u.payload["ciphertexts"] if v not in nbrs or v not in state.adverts]
        if bad or me not in state.adverts:
            raise _bad(
                "bad_secagg",
                f"shares addressed to {bad[:5]}, not neighbours of {me} with advertised keys"
                if bad
                else f"client {me} advertised no keys in this round",
            )
    elif u.kind == "masked":
        length = int(state.secagg.get("vector_length", state.payload_size))
        if u.payload["vector"].shape != (length,):
            raise _bad(
                "bad_secagg", f"the masked input has {u.payload['vector'].shape[0]} words; the round masks {length}"
            )
        _check_ring_width(u, state.secagg)
        if me not in set(int(v) for v in state.secagg.get("sharers", ())):
            raise _bad(
                "bad_secagg",
                f"client {me} did not share keys in round {state.round}: its masked input could never be unmasked",
            )
    elif u.kind == "consistency":
        if me not in state.survivors:
            raise _bad("bad_secagg", f"client {me} is not a survivor of round {state.round}")
    elif u.kind == "reveal":
        bad = [v for v, (_, x, _, _) in u.payload["shares"].items() if v not in nbrs or x != me]
        if bad:
            raise _bad("bad_secagg", f"reveals for {bad[:5]}: not neighbours of {me}, or share points other than {me}")
        if me not in state.survivors:
            raise _bad("bad_secagg", f"client {me} is not a survivor of round {state.round}")


def _check_ring_width(u: Upload, secagg: Mapping[str, Any]) -> None:
    """A compressed round (``secagg.compression``, the signed configuration's ring Z_{2^r}) takes masked
    words packed r bits each and nothing else; any other round takes unpacked uint32 words only."""
    comp = secagg.get("compression")
    want = None if comp is None else int(comp["ring_bits"])
    got = u.payload.get("ring_bits")
    if got != want:
        raise _bad(
            "bad_secagg",
            f"the masked input is packed at {got} bits per word; the signed configuration's ring is {want} bits"
            if got is not None and want is not None
            else f"the masked input is packed at {got} bits per word; this round's masked inputs are unpacked "
            "uint32 words"
            if got is not None
            else f"the masked input is unpacked uint32 words; this round's ring is Z_(2^{want}), packed {want} bits "
            "per word",
        )
    if want is not None and int(np.asarray(u.payload["vector"]).max(initial=0)) >> want:
        raise _bad("bad_secagg", f"the masked input has words outside the ring Z_(2^{want})")
