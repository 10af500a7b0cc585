"""An FL device's ledger and state survive app restarts (store schema 4), and its own sample-level cap holds
against a server that keeps selecting it and restarts it between rounds.

The attack tests play the server with a scripted HTTP transport: it serves a correctly signed round view
with ``local_dp_sgd`` round after round and counts the updates it receives. Before schema 4 the device's
ledger lived in memory, so a restarted device started from ε = 0 and trained every round it was offered."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest

from client_sdk.fl.device import FLDevice
from client_sdk.fl.device_store import FLDeviceStore
from client_sdk.store import DB_FILENAME, SCHEMA_VERSION, Store
from client_sdk.upload.uploader import HttpRequest, HttpResponse
from estimator.fl.task import FLTaskSpec
from ldp_core.fl.errors import FLError
from ldp_core.fl.local_dpsgd import LocalDPSGDSpec
from ldp_core.fl.protocol import encode_vector, parse_upload
from tests.support.fl_pipeline_support import (
    device_rng,
    drive,
    enroll,
    in_process_clients,
    make_data,
    running_task,
    task_spec,
)

DELTA = 1e-5
#: a cheap spec to account (T = 2 steps a round): ε(1 round) ≈ 0.65, ε(4) ≈ 1.36 at δ = 1e-5
SPEC = {"noise_multiplier": 4.0, "clip": 1.0, "sample_rate": 0.25, "steps": 2}
CAP = 1.2


def _epsilon(rounds: int) -> float:
    """dp_accounting's replace-one PLD ε of ``rounds`` rounds of SPEC (T·rounds Poisson-sampled Gaussian steps)."""
    step = dp_accounting.PoissonSampledDpEvent(
        SPEC["sample_rate"], dp_accounting.GaussianDpEvent(SPEC["noise_multiplier"])
    )
    acc = dp_accounting.pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(step, SPEC["steps"] * rounds))
    return float(acc.get_epsilon(DELTA))


class MaliciousServer:
    """Plays the collector: every fetch shows round ``self.round`` selecting the device (signed, valid), and
    every update is accepted and kept (the test opens the next round by raising ``round``)."""

    def __init__(self, spec: FLTaskSpec) -> None:
        self.spec = spec
        self.round = 0
        self.updates: list[int] = []
        self.fail_posts = False
        self.n = spec.build_model().num_params

    def view(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "phase": "train",
            "selected": True,
            "num_params": self.n,
            "params": encode_vector(np.zeros(self.n, np.float32)),
            "algorithm": "fedavg",
            "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1, "max_steps": None},
            "prox_mu": 0.0,
            "model": dict(self.spec.model),
            "clip_norm": self.spec.device_clip_norm,
            "task_config": {"config": self.spec.signed_config(), "signature": self.spec.task_signature},
        }

    def __call__(self, req: HttpRequest) -> HttpResponse:
        if req.method == "GET":
            return HttpResponse(200, {}, json.dumps(self.view()).encode())
        if self.fail_posts:
            raise OSError("connection reset")  # the device crashed or lost the network before the upload
        assert req.body is not None
        u = parse_upload(req.body, payload_size=self.n)
        self.updates.append(u.round)
        return HttpResponse(202, {}, b"{}")


def _device(server: MaliciousServer, X: np.ndarray, y: np.ndarray, **kw: Any) -> FLDevice:
    return FLDevice(
        "http://127.0.0.1:9",
        server.spec.task,
        "dev-0",
        X,
        y,
        identity=enroll("dev-0"),
        transport=server,
        max_attempts=1,
        sleep=lambda s: None,
        rng_for_round=lambda r: np.random.default_rng([5, r]),
        dpsgd_noise_rng_for_round=lambda r: np.random.default_rng([6, r]),
        **kw,
    )


def _data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(16, 4)).astype(np.float32)
    return X, (X[:, 0] > 0).astype(np.int64)


def _attack(server: MaliciousServer, make: Callable[[], FLDevice], rounds: int) -> list[FLDevice]:
    """Offer ``rounds`` rounds, restarting the device (a new FLDevice) before each one."""
    devices = []
    for _ in range(rounds):
        dev = make()
        devices.append(dev)
        dev.step()
        dev.close()
        server.round += 1
    return devices


def test_a_restarted_device_keeps_its_ledger_and_the_cap_holds_against_the_server(tmp_path: Path) -> None:
    spec = task_spec("cap", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, delta=DELTA)
    X, y = _data()
    allowed = max(k for k in range(1, 20) if _epsilon(k) <= CAP)
    assert 2 <= allowed < 8 and _epsilon(allowed + 1) > CAP  # the cap binds inside the attack's 10 rounds

    server = MaliciousServer(spec)
    devices = _attack(server, lambda: _device(server, X, y, storage_dir=tmp_path / "sdk", max_sample_epsilon=CAP), 10)
    # the server got exactly the rounds the cap allows, and no more, although it restarted the device each time
    assert server.updates == list(range(allowed))
    assert sum(d.errors["SampleBudgetExceeded"] for d in devices) == 10 - allowed
    with _device(server, X, y, storage_dir=tmp_path / "sdk") as dev:  # the ledger as the next start reads it
        assert dev.sample_accountant is not None and dev.sample_accountant.rounds == allowed
        rep = dev.sample_level_privacy()
        assert (
            rep is not None and rep["epsilon"] == pytest.approx(_epsilon(allowed), rel=1e-9) and rep["epsilon"] <= CAP
        )

    # the same attack on a device without a store (all the SDK had before schema 4): every restart starts from
    # an empty ledger, the cap never binds, and the server gets every round it asks for
    forgetful = MaliciousServer(spec)
    devices = _attack(forgetful, lambda: _device(forgetful, X, y, max_sample_epsilon=CAP), 10)
    assert forgetful.updates == list(range(10))
    assert all(d.sample_accountant is not None and d.sample_accountant.rounds == 1 for d in devices)


def test_the_ledger_row_is_committed_before_the_upload_and_a_trained_round_is_not_trained_again(
    tmp_path: Path,
) -> None:
    spec = task_spec("spend-first", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, delta=DELTA)
    X, y = _data()
    server = MaliciousServer(spec)
    server.fail_posts = True  # the update never leaves: the spend is on disk all the same (over-count only)
    with _device(server, X, y, storage_dir=tmp_path / "sdk") as dev:
        assert dev.step() == "failed" and server.updates == []
    rows = (
        sqlite3.connect(tmp_path / "sdk" / DB_FILENAME)
        .execute("SELECT task, round, spec, delta FROM fl_sample_ledger")
        .fetchall()
    )
    assert rows == [("spend-first", 0, json.dumps(SPEC, sort_keys=True, separators=(",", ":")), DELTA)]
    # restarted, offered the same round again: it does not train a second noisy update of round 0
    server.fail_posts = False
    with _device(server, X, y, storage_dir=tmp_path / "sdk") as dev:
        assert dev.step() == "idle" and server.updates == []
        with pytest.raises(FLError, match="already"):  # and the ledger refuses it even if asked directly
            dev._train(server.view())
        server.round = 1
        assert dev.step() == "update" and server.updates == [1]
        assert dev.sample_accountant is not None and dev.sample_accountant.recorded_rounds == {0, 1}


def test_the_cap_and_the_store_refuse_bad_settings(tmp_path: Path) -> None:
    spec = task_spec("bad", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, delta=DELTA)
    X, y = _data()
    server = MaliciousServer(spec)
    for bad in (0, -1.0, float("nan"), float("inf"), True, "2"):
        with pytest.raises(FLError, match="max_sample_epsilon"):
            _device(server, X, y, max_sample_epsilon=bad)
    store = FLDeviceStore(tmp_path / "sdk")
    store.record_round("bad", 0, LocalDPSGDSpec(**SPEC), DELTA)
    with pytest.raises(FLError, match="already"):
        store.record_round("bad", 0, LocalDPSGDSpec(**SPEC), DELTA)
    store.close()
    # the server changes δ for the same task under a fresh signature: the device keeps the ledger's δ
    looser = task_spec("bad", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, delta=1e-3)
    server2 = MaliciousServer(looser)
    server2.round = 1
    with _device(server2, X, y, storage_dir=tmp_path / "sdk") as dev:
        assert dev.step() == "failed" and dev.errors["FLError"] == 1 and server2.updates == []


def test_a_version_3_store_is_upgraded_in_place(tmp_path: Path) -> None:
    store = Store(tmp_path / "sdk")
    with store.transaction() as conn:
        Store.bump_counters(conn, {"uploaded_batches": 3})
        for table in ("fl_sample_ledger", "fl_state", "fl_arrays"):
            conn.execute(f"DROP TABLE {table}")
        conn.execute("PRAGMA user_version = 3")
    store.close()
    fl = FLDeviceStore(tmp_path / "sdk")
    conn = fl.store.connection()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert fl.store.counters() == {"uploaded_batches": 3}
    assert fl.ledger("t") is None and fl.last_round("t") is None
    fl.record_round("t", 4, LocalDPSGDSpec(**SPEC), DELTA)
    acc = fl.ledger("t")
    assert acc is not None and acc.recorded_rounds == {4} and acc.spec == LocalDPSGDSpec(**SPEC)
    fl.close()


def test_client_state_round_trips_bit_for_bit_and_belongs_to_its_model(tmp_path: Path) -> None:
    from ldp_core.fl.training import ClientState

    rng = np.random.default_rng(0)
    state = ClientState(
        control=rng.normal(size=7).astype(np.float32),
        personal=rng.normal(size=(3, 2)),
        previous=None,
    )
    fl = FLDeviceStore(tmp_path / "sdk")
    fl.save_state("t", '{"kind":"a"}', state, np.arange(7, dtype=np.float32), {"round": 2})
    fl.close()
    fl = FLDeviceStore(tmp_path / "sdk")
    back = fl.load_state("t", '{"kind":"a"}')
    assert back.control is not None and back.control.dtype == np.float32
    assert back.control.tobytes() == state.control.tobytes()
    assert back.personal is not None and back.personal.shape == (3, 2) and np.array_equal(back.personal, state.personal)
    assert back.previous is None
    assert fl.load_state("t", '{"kind":"b"}') == ClientState()  # another model: nothing carried over
    last = fl.last_round("t")
    assert last is not None and last[1] == {"round": 2} and np.array_equal(last[2], np.arange(7))
    fl.close()


# -- Ditto's personal model across restarts, over the real collector and job ------------------------------
def _ditto_device(url: str, spec: FLTaskSpec, data: Any, root: Path, i: int) -> FLDevice:
    c, (X, y) = spec.clients[i], data[i]
    return FLDevice(
        url,
        spec.task,
        c,
        X,
        y,
        rng_for_round=lambda r: device_rng(i, r),
        timeout=15.0,
        backoff=0.05,
        identity=enroll(c),
        storage_dir=root / c,
    )


class Restarting:
    """A device that the app restarts (a new FLDevice over the same store) after each of its uploads."""

    def __init__(self, make: Callable[[], FLDevice]) -> None:
        self.make, self.dev, self.restarts = make, make(), 0

    def step(self) -> str:
        kind = self.dev.step()
        if kind == "update":
            self.dev.close()
            self.dev, self.restarts = self.make(), self.restarts + 1
        return kind


def test_a_ditto_device_restarted_after_every_round_ends_with_the_never_restarted_personal_model(
    tmp_path: Path,
) -> None:
    spec = task_spec("ditto-r", 6, clip_norm=None, noise_multiplier=0.0, personalization={"kind": "ditto", "lam": 0.5})
    data = make_data(6)
    _, clients = in_process_clients(spec, data)  # the personal models of devices that never restart
    index = {c: i for i, c in enumerate(spec.clients)}
    with running_task(tmp_path, spec, checkpoint_interval=0.2) as (_, srv, jt):
        root = tmp_path / "devices"
        restarting = [
            Restarting(lambda i=i: _ditto_device(srv.url, spec, data, root, i)) for i in range(len(spec.clients))
        ]
        drive(restarting, jt.finished, timeout=60)  # type: ignore[arg-type]
    assert sum(r.restarts for r in restarting) >= spec.rounds * 4 - 2
    trained = 0
    for r, c in zip(restarting, clients, strict=True):
        r.dev.close()
        # a fresh start of the app, before any further round: the personal model it predicts with
        with _ditto_device("http://127.0.0.1:9", spec, data, root, index[c.client_id]) as dev:
            got = dev.personalized_params()
            if c.state.personal is None:
                assert got is None
                continue
            trained += 1
            assert got is not None and np.array_equal(got, c.state.personal)
            assert dev.state.personal is not None and np.array_equal(dev.state.personal, c.state.personal)
    assert trained >= 4


def test_a_server_cannot_drop_local_dp_sgd_once_the_device_trained_under_it(tmp_path: Path) -> None:
    """Playing the server: after one round under the signed local_dp_sgd, it serves views without the
    configuration (plain SGD would release the examples without sample-level DP), also after a restart."""
    spec = task_spec("downgrade", 4, training={"learning_rate": 0.1}, local_dp_sgd=SPEC, delta=DELTA)
    X, y = _data()
    server = MaliciousServer(spec)
    with _device(server, X, y, storage_dir=tmp_path / "sdk") as dev:
        assert dev.step() == "update" and server.updates == [0]
    plain = server.view

    def stripped() -> dict[str, Any]:
        return {**plain(), "task_config": None}

    server.view = stripped  # type: ignore[method-assign]
    for r in (1, 2):
        server.round = r
        with _device(server, X, y, storage_dir=tmp_path / "sdk") as dev:  # restarted before each round
            assert dev.step() == "failed" and dev.errors["FLError"] == 1
    assert server.updates == [0]
    # a device that never trained under it (a fresh store) takes the plain round, as documented
    with _device(server, X, y, storage_dir=tmp_path / "fresh") as dev:
        assert dev.step() == "update" and server.updates == [0, 2]
