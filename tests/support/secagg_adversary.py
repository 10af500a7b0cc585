"""A malicious SecAgg server played over HTTP against real :class:`client_sdk.fl.device.FLDevice` objects (issue 28).

The operator runs both the collector and the job, so the adversary here is one HTTP server speaking the
collector's device API (``GET …/round?client_id=``, ``POST …/uploads``) on 127.0.0.1, port 0: it serves each
device the round document it chooses (:meth:`ldp_core.fl.protocol.RoundState.view_for` of a state it builds per
device) and reads every upload (:func:`ldp_core.fl.protocol.parse_upload`). Two attacks:

* :func:`run_split`: Bonawitz et al.'s split with colluders. The server controls ``colluders`` (real devices whose
  SecAgg secrets it reads, and whose device keys sign any survivor set it asks for). It tells t − c honest share
  holders of the target "the target survived" (they reveal shares of b_u) and t − c others "it dropped" (shares of
  s_u), passes each the consistency signatures made on its own set, rebuilds both secrets and strips every mask
  from the target's masked input.
* :func:`run_mitm`: the server replaces every neighbour advert the target sees by adverts of Sybil devices whose
  credentials its enrollment authority issued for ids outside the task, decrypts the shares the target sends
  them and unmasks the target's input.

Each returns an :class:`Outcome`: whether the target's quantized update was recovered exactly, and why not.
"""

from __future__ import annotations

import base64
import dataclasses
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from client_sdk.fl.device import FLDevice
from ldp_core.fl.protocol import RoundState, UpdateRejected, make_upload, parse_upload, sign_upload
from ldp_core.fl.secagg import (
    SURVIVORS_TAG,
    Quantizer,
    SecAggError,
    Share,
    add_masks,
    pairwise_seed,
    shamir_combine,
    survivors_message,
)
from tests.support.fl_pipeline_support import AUTHORITY, enroll


@dataclasses.dataclass
class Outcome:
    recovered: bool
    reason: str
    target_errors: dict[str, int]
    target_last_error: str | None = None


class _Collector:
    """The server's HTTP side: per-device round documents in, uploads out."""

    def __init__(self, task: str, payload_size: int) -> None:
        self.task = task
        self.payload_size = payload_size
        self.views: dict[str, dict[str, Any]] = {}
        self.uploads: dict[tuple[str, str], Any] = {}
        self.lock = threading.Lock()

    def handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        col = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, status: int, obj: Any) -> None:
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                parts = urllib.parse.urlsplit(self.path)
                cid = urllib.parse.parse_qs(parts.query).get("client_id", [""])[0]
                with col.lock:
                    view = col.views.get(cid)
                self._send(200, view) if view is not None else self._send(404, {"error": "unknown"})

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    u = parse_upload(body, payload_size=col.payload_size)
                except UpdateRejected as exc:
                    self._send(400, {"error": str(exc)})
                    return
                with col.lock:
                    col.uploads[(u.kind, u.client_id)] = u
                self._send(202, {"accepted": True})

        return H


@contextmanager
def _serve(spec: Any) -> Iterator[tuple[_Collector, str]]:
    col = _Collector(spec.task, int(spec.build_model().num_params))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), col.handler())
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield col, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _signed(spec: Any) -> dict[str, Any]:
    sig = base64.b64encode(AUTHORITY.sign_document(spec.signed_config())).decode()
    return {"config": spec.signed_config(), "signature": sig}


def _base_state(spec: Any, ids: Mapping[int, str], graph: Mapping[int, Sequence[int]], t: int) -> RoundState:
    model = dict(spec.model)
    n_params = int(spec.build_model().num_params)
    q = Quantizer.for_clients(len(ids), float(spec.clip_norm))
    sa = {
        "num_clients": len(ids),
        "neighbors": {str(u): list(vs) for u, vs in graph.items()},
        "threshold": t,
        "vector_length": n_params,
        "clip_range": q.clip_range,
        "scale": q.scale,
        "max_clients": q.max_clients,
    }
    return RoundState(
        task=spec.task,
        seq=0,
        round=0,
        phase="advertise",
        rounds=1,
        model=model,
        params=np.zeros(n_params, np.float32),
        algorithm="fedavg",
        training=dict(spec.training),
        clip_norm=spec.clip_norm,
        selected=tuple(ids.values()),
        secagg=sa,
        indices={c: u for u, c in ids.items()},
        enrollment_key=AUTHORITY.public_key,
        task_config=_signed(spec),
    )


def _devices(
    url: str, spec: Any, ids: Mapping[int, str], data: Sequence[tuple[np.ndarray, np.ndarray]]
) -> dict[int, FLDevice]:
    return {
        u: FLDevice(url, spec.task, c, *data[u - 1], identity=enroll(c), max_attempts=1, timeout=5.0)
        for u, c in ids.items()
    }


def _publish(col: _Collector, states: Mapping[str, RoundState]) -> None:
    with col.lock:
        col.views = {c: json.loads(json.dumps(s.view_for(c))) for c, s in states.items()}


def _unmask_target(
    y: np.ndarray, b: int, s: int, target: int, mask_keys: Mapping[int, bytes], masked_with: Sequence[int]
) -> np.ndarray:
    s_key = X25519PrivateKey.from_private_bytes(s.to_bytes(32, "little"))
    masks = [(b.to_bytes(32, "little"), -1)]
    for v in masked_with:
        seed = pairwise_seed(s_key, X25519PublicKey.from_public_bytes(mask_keys[v]), 0, target, v)
        masks.append((seed, -1 if v > target else 1))
    return add_masks(y.copy(), masks)


def _assign(
    graph: Mapping[int, Sequence[int]], target: int, colluders: Sequence[int], t: int
) -> dict[int, bool] | None:
    """Which survivor set each honest device is shown (True: "the target survived"), so that t − c of the
    target's honest holders on each side count t signatures of their own set among their neighbours (the
    consistency round): colluders sign both sets, every honest device one. Exhaustive over the choice of the
    t − c holders told "survived" (the other holders are told "dropped") and over the sets shown to the
    non-holders (the server knows the graph); None if no assignment works."""
    import itertools

    holders = [v for v in graph[target] if v not in colluders]
    others = [u for u in graph if u != target and u not in colluders and u not in holders]
    need = t - len(colluders)
    if need <= 0:
        return {u: True for u in graph}
    if len(others) > 16:
        raise ValueError("too many non-holders for the exhaustive search")
    for b_side in itertools.combinations(holders, need):
        for mask in range(1 << len(others)):
            side = {u: u in b_side for u in holders}
            side.update({u: bool(mask >> i & 1) for i, u in enumerate(others)})
            side[target] = True

            def ok(h: int, side: dict[int, bool] = side) -> bool:
                return sum(1 for v in graph[h] if v in colluders or side.get(v) == side[h]) >= t

            if all(ok(h) for h in b_side) and sum(ok(h) for h in holders if not side[h]) >= need:
                return side
    return None


def run_split(
    spec: Any,
    graph: Mapping[int, Sequence[int]],
    t: int,
    target: int,
    colluders: Sequence[int],
    data: Sequence[tuple[np.ndarray, np.ndarray]],
) -> Outcome:
    """The split attack on ``target`` (an index 1..n of ``graph``) with threshold ``t`` and ``colluders``."""
    ids = {u: spec.clients[u - 1] for u in graph}
    base = _base_state(spec, ids, graph, t)
    holders = [v for v in graph[target] if v not in colluders]
    need = t - len(colluders)
    with _serve(spec) as (col, url):
        devs = _devices(url, spec, ids, data)
        tdev = devs[target]

        def out(recovered: bool, reason: str) -> Outcome:
            return Outcome(recovered, reason, dict(tdev.errors), getattr(tdev, "last_error", None))

        _publish(col, {c: base for c in ids.values()})
        for d in devs.values():
            d.step()
        adverts = {u: col.uploads.get(("advert", c)) for u, c in ids.items()}
        if any(a is None for a in adverts.values()):
            return out(False, "a device sent no advert")
        state = dataclasses.replace(
            base,
            phase="share",
            adverts={u: (a.payload["share_key"], a.payload["mask_key"]) for u, a in adverts.items()},
            advert_auth={u: {"client_id": a.client_id, **a.auth} for u, a in adverts.items()},
        )
        _publish(col, {c: state for c in ids.values()})
        for d in devs.values():
            d.step()
        if ("shares", ids[target]) not in col.uploads:
            return out(False, "the target refused to share its secrets")
        inbox: dict[int, dict[int, bytes]] = {u: {} for u in graph}
        for u, c in ids.items():
            sh = col.uploads.get(("shares", c))
            for v, ct in ({} if sh is None else sh.payload["ciphertexts"]).items():
                inbox[v][u] = ct
        state = dataclasses.replace(state, phase="masked", inbox=inbox)
        _publish(col, {c: state for c in ids.values()})
        for d in devs.values():
            d.step()
        if ("masked", ids[target]) not in col.uploads:
            return out(False, "the target sent no masked input")
        y = np.asarray(col.uploads[("masked", ids[target])].payload["vector"], np.uint32)
        if need > 0 and 2 * need > len(holders):
            return out(False, f"too few honest holders: {len(holders)} < 2(t − c) = {2 * need}")
        side = _assign(graph, target, colluders, t)
        if side is None:
            return out(False, "no assignment of survivor sets gives t − c holders on each side t signatures")
        everyone = tuple(sorted(graph))
        without = tuple(u for u in everyone if u != target)
        shown = {ids[u]: (everyone if side.get(u, True) else without) for u in graph}
        states = {
            c: dataclasses.replace(state, phase="consistency", survivors=v, dropped=(target,) if v == without else ())
            for c, v in shown.items()
        }
        _publish(col, states)
        for d in devs.values():
            d.step()
        sigs: dict[tuple[int, ...], dict[int, dict[str, str]]] = {everyone: {}, without: {}}
        for u, c in ids.items():
            up = col.uploads.get(("consistency", c))
            if up is not None:
                sigs[shown[c]][u] = {"client_id": c, "signature": base64.b64encode(up.payload["signature"]).decode()}
        for u in colluders:  # the server's devices sign the other set too
            for view in (everyone, without):
                sig = enroll(ids[u]).sign(SURVIVORS_TAG, survivors_message(spec.task, 0, view))
                sigs[view][u] = {"client_id": ids[u], "signature": base64.b64encode(sig).decode()}
        states = {c: dataclasses.replace(s, phase="unmask", consistency=sigs[shown[c]]) for c, s in states.items()}
        _publish(col, states)
        for d in devs.values():
            d.step()
        b_sh, s_sh = [], []
        for u in colluders:  # the server reads its devices' shares of both secrets
            pair = devs[u]._round["client"]._held.get(target)
            if pair is not None:
                b_sh.append(pair.b)
                s_sh.append(pair.s)
        for u in holders:
            up = col.uploads.get(("reveal", ids[u]))
            got = None if up is None else up.payload["shares"].get(target)
            if got is not None:
                kind, x, yy, thr = got
                (b_sh if kind == "b" else s_sh).append(Share(x, yy, thr))
        if len(b_sh) < t or len(s_sh) < t:
            return out(False, f"only {len(b_sh)} shares of b and {len(s_sh)} of s; t = {t}")
        try:
            b, s = shamir_combine(b_sh[:t]), shamir_combine(s_sh[:t])
        except SecAggError as exc:
            return out(False, str(exc))
        mask_keys = {u: a.payload["mask_key"] for u, a in adverts.items()}
        x = _unmask_target(y, b, s, target, mask_keys, sorted(inbox[target]))
        ok = np.array_equal(x, tdev.quantized.get(0))
        return out(ok, "recovered" if ok else "the unmasked vector is not the target's input")


def run_mitm(
    spec: Any, graph: Mapping[int, Sequence[int]], t: int, target: int, data: Sequence[tuple[np.ndarray, np.ndarray]]
) -> Outcome:
    """The server shows ``target`` only Sybil neighbours (ids outside the task, credentials from the operator's
    enrollment authority) and unmasks its input from the shares it sends them."""
    from ldp_core.fl import secagg as sa_mod

    ids = {u: spec.clients[u - 1] for u in graph}
    base = _base_state(spec, ids, graph, t)
    sybils = {v: enroll(f"sybil-{v}") for v in graph[target]}
    keys = {v: (X25519PrivateKey.generate(), X25519PrivateKey.generate()) for v in sybils}
    with _serve(spec) as (col, url):
        tdev = FLDevice(url, spec.task, ids[target], *data[target - 1], identity=enroll(ids[target]), max_attempts=1)

        def out(recovered: bool, reason: str) -> Outcome:
            return Outcome(recovered, reason, dict(tdev.errors), getattr(tdev, "last_error", None))

        _publish(col, {ids[target]: base})
        tdev.step()
        mine = col.uploads.get(("advert", ids[target]))
        if mine is None:
            return out(False, "the target sent no advert")
        adverts, auths = {}, {}
        for v, ident in sybils.items():
            c, s = keys[v]
            payload = {
                "share_key": sa_mod.public_bytes(c.public_key()),
                "mask_key": sa_mod.public_bytes(s.public_key()),
            }
            up = sign_upload(make_upload(spec.task, 0, "advert", ident.device_id, payload), ident)
            adverts[v] = (payload["share_key"], payload["mask_key"])
            auths[v] = {"client_id": ident.device_id, **(up.auth or {})}
        adverts[target] = (mine.payload["share_key"], mine.payload["mask_key"])
        auths[target] = {"client_id": mine.client_id, **(mine.auth or {})}
        state = dataclasses.replace(base, phase="share", adverts=adverts, advert_auth=auths)
        _publish(col, {ids[target]: state})
        tdev.step()
        sh = col.uploads.get(("shares", ids[target]))
        if sh is None:
            return out(False, "the target sent no shares")
        tpub = X25519PublicKey.from_public_bytes(mine.payload["share_key"])
        b_sh, s_sh, inbox = [], [], {}
        for v, ct in sh.payload["ciphertexts"].items():  # the server holds every Sybil's share key
            key = sa_mod._share_key(keys[v][0], tpub, 0)
            sent_aad = (0).to_bytes(8, "little") + target.to_bytes(4, "little") + v.to_bytes(4, "little")
            _, _, pair = sa_mod._decode_pair(AESGCM(key).decrypt(ct[:12], ct[12:], sent_aad))
            b_sh.append(pair.b)
            s_sh.append(pair.s)
            fake = sa_mod._encode_pair(v, target, Share(target, 1, t), Share(target, 1, t))  # shares "from" v
            nonce = bytes(12)
            aad = (0).to_bytes(8, "little") + v.to_bytes(4, "little") + target.to_bytes(4, "little")
            inbox[v] = nonce + AESGCM(key).encrypt(nonce, fake, aad)
        state = dataclasses.replace(state, phase="masked", inbox={target: inbox})
        _publish(col, {ids[target]: state})
        tdev.step()
        up = col.uploads.get(("masked", ids[target]))
        if up is None or len(b_sh) < t:
            return out(False, "the target sent no masked input")
        y = np.asarray(up.payload["vector"], np.uint32)
        x = _unmask_target(
            y,
            shamir_combine(b_sh[:t]),
            shamir_combine(s_sh[:t]),
            target,
            {v: adverts[v][1] for v in adverts},
            sorted(inbox),
        )
        ok = np.array_equal(x, tdev.quantized.get(0))
        return out(ok, "recovered" if ok else "the unmasked vector is not the target's input")
