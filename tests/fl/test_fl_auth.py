"""Authenticated devices (issue 13): attacks by an outsider on SecAgg slots, and by a server on adverts.

The enrollment module's own checks (credentials, request signatures, replay) are in
tests/fl/test_fl_enrollment.py."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ldp_core.fl.protocol import encode_upload, make_upload
from ldp_core.fl.secagg import KeyAdvert, SecAggClient, SecAggConfig
from tests.support.fl_pipeline_support import (
    devices_for,
    drive,
    enroll,
    make_data,
    running_task,
    served_status,
    task_spec,
)


class Outsider:
    """Not enrolled as the target: it claims the target's client id with unsigned requests. It advertises
    keys for the target's slot before the target does, sends shares, then reads the target's inbox and
    decrypts the shares the neighbours encrypted to its keys. It also writes a forged advert straight to
    the updates topic (what a compromised collector could do)."""

    def __init__(self, url: str, task: str, target: str) -> None:
        self.round_url = f"{url}/v1/fl/tasks/{task}/round"
        self.post_url = f"{url}/v1/fl/tasks/{task}/uploads"
        self.task, self.target = task, target
        self.client: SecAggClient | None = None
        self.done: set[str] = set()
        self.statuses: list[int] = []
        self.decrypted = 0

    def _post(self, kind: str, payload: dict[str, Any]) -> None:
        u = make_upload(self.task, 0, kind, self.target, payload)
        r = httpx.post(self.post_url, content=encode_upload(u), headers={"Content-Type": "application/json"})
        self.statuses.append(r.status_code)

    def step(self) -> None:
        r = httpx.get(self.round_url, params={"client_id": self.target}, timeout=10)
        self.statuses.append(r.status_code)
        if r.status_code != 200:
            return
        view = r.json()
        phase = view["phase"]
        if phase in self.done or not view.get("selected"):
            return
        self.done.add(phase)
        sa = view["secagg"]
        if phase == "advertise":
            cfg = SecAggConfig(
                0,
                int(sa["num_clients"]),
                {int(u): tuple(vs) for u, vs in sa["neighbors"].items()},
                int(sa["threshold"]),
                int(sa["vector_length"]),
            )
            self.client = SecAggClient(int(view["index"]), cfg, os.urandom)
            a = self.client.advertise_keys()
            self._post("advert", {"share_key": a.share_key, "mask_key": a.mask_key})
        elif phase == "share" and self.client is not None:
            adverts = {
                int(u): KeyAdvert(int(u), base64.b64decode(a), base64.b64decode(b))
                for u, (a, b) in view["adverts"].items()
            }
            self._post("shares", {"ciphertexts": self.client.share_keys(adverts)})
        elif phase == "masked" and self.client is not None:
            inbox = {int(u): base64.b64decode(ct) for u, ct in view["inbox"].items()}
            self.client.masked_input(np.zeros(int(sa["vector_length"]), np.uint32), inbox)
            self.decrypted = len(self.client._held)


def test_an_outsider_cannot_take_over_a_selected_clients_secagg_slot(tmp_path: Path) -> None:
    """On the old code the outsider's advert came first and was accepted, the real device's was refused
    as a duplicate, and the outsider decrypted the shares of b_v and s_v from every neighbour of the slot
    (4 on the complete graph of 5: more than t = 3, so it could rebuild their secrets with one more). Now
    every request of the outsider is refused (401), a forged advert on the topic is refused by the job, the
    real device keeps its slot, and the round unmasks the honest sum."""
    spec = task_spec(
        "slot",
        5,
        secagg=True,
        sampling={"kind": "fixed", "count": 5},
        rounds=1,
        noise_multiplier=0.0,
        phase_timeout=3.0,
    )
    data = make_data(5)
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (tr, srv, jt):
        out = Outsider(srv.url, spec.task, "dev-0")
        served_status(srv.url, spec.task, lambda st: st.get("phase") == "advertise")
        out.step()  # first in line
        forged = make_upload(spec.task, 0, "advert", "dev-0", {"share_key": bytes(32), "mask_key": bytes(range(32))})
        tr.publish(jt.topics.updates, spec.task.encode(), encode_upload(forged))
        devices = devices_for(srv.url, spec, data)

        def finished() -> bool:
            out.step()
            return jt.finished()

        drive(devices, finished, timeout=60)
        status = jt.result
    assert out.decrypted == 0
    assert set(out.statuses) == {401}, out.statuses
    assert status is not None and status["rejected"].get("unauthenticated", 0) >= 1
    [rec] = status["history"]
    assert "failed" not in rec and rec["clients"] == 5
    assert status["accepted"]["advert"] == 5


def test_a_peer_drops_an_advert_the_server_swapped() -> None:
    """A malicious server replaces the keys in a neighbour's advert with its own (keeping the neighbour's
    signature and credential), and adds an advert of its own under another index claiming the same
    device: the device verifies each advert and sends shares to neither."""
    from client_sdk.fl.device import FLDevice

    spec = task_spec("swap", 4, secagg=True, sampling={"kind": "fixed", "count": 4})
    ids = {i: enroll(f"dev-{i - 1}") for i in range(1, 5)}
    adverts, auths = {}, {}
    for i, ident in ids.items():
        keys = {"share_key": os.urandom(32), "mask_key": os.urandom(32)}
        from ldp_core.fl.protocol import sign_upload

        up = sign_upload(make_upload(spec.task, 0, "advert", ident.device_id, keys), ident)
        adverts[str(i)] = [base64.b64encode(keys["share_key"]).decode(), base64.b64encode(keys["mask_key"]).decode()]
        assert up.auth is not None
        auths[str(i)] = {"client_id": ident.device_id, **up.auth}
    adverts["2"][1] = base64.b64encode(b"\x07" * 32).decode()  # the server's own mask key in dev-1's advert
    auths["4"] = dict(auths["3"])  # dev-2's signature under index 4 (keys of dev-3): two indices, one device
    view = {"adverts": {u: adverts[u] for u in ("2", "3", "4")}, "advert_auth": {u: auths[u] for u in ("2", "3", "4")}}
    dev = FLDevice("http://127.0.0.1:9", spec.task, "dev-0", *make_data(1)[0], identity=ids[1])
    dev._round = {"round": 0, "task_clients": frozenset(spec.clients)}
    got = dev._verified_adverts(view, 0)
    assert set(got) == {3} and dev.errors["bad_advert"] == 2
