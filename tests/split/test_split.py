"""Split learning: the wire format, the activations' DP (clipping, noise, ε against dp_accounting), and
training plus the server's inversion attack over a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from client_sdk.split import BottomModel, SplitClient, SplitServerError
from client_sdk.upload.uploader import HttpRequest, urllib_transport
from estimator.split.server import SplitServer, create_app
from ldp_cli.main import main
from ldp_core.errors import ConfigError
from ldp_core.fl.dpsgd_accounting import dpsgd_epsilon
from ldp_core.privacy_events import sampled_gaussian_event
from ldp_core.split import SmashedDP, SplitWireError, decode_message, encode_message
from simulator.split import SplitStudy, fetch_observed, load_digits_split, run_attack, run_split
from simulator.stack import serve_in_thread


@pytest.fixture
def server_url():  # type: ignore[no-untyped-def]
    server = SplitServer(16, 10, 0.3, record=True)
    uvi, url, thread = serve_in_thread(create_app(server), lifespan="off")
    try:
        yield server, url
    finally:
        uvi.should_exit = True
        thread.join(30)


def test_wire_round_trip_and_rejections() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.array([1, 2, 3])
    meta, arrays = decode_message(encode_message({"k": 1}, {"a": a, "y": y}))
    assert meta == {"k": 1} and np.array_equal(arrays["a"], a) and np.array_equal(arrays["y"], y)
    assert arrays["y"].dtype == np.dtype("<i8") and arrays["a"].dtype == np.dtype("<f4")
    body = encode_message({}, {"a": a})
    for bad in (b"", b"XXXX" + body[4:], body[:-1], body + b"\0", body[:8]):
        with pytest.raises(SplitWireError):
            decode_message(bad)
    huge = encode_message({}, {}).replace(b'"arrays":[]', b'"arrays":[{"name":"a","dtype":"<f4","shape":[99999999]}]')
    huge = huge[:4] + len(huge[8:]).to_bytes(4, "big") + huge[8:]
    with pytest.raises(SplitWireError, match="truncated"):
        decode_message(huge)
    with pytest.raises(SplitWireError, match="dtype"):
        decode_message(encode_message({}, {"a": a}).replace(b"<f4", b"|O8"))


def test_clipping_and_noise() -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(scale=5.0, size=(20_000, 8))
    clipped, scale = SmashedDP(2.0, 0.0).privatize(a, rng)
    assert np.all(np.linalg.norm(clipped, axis=1) <= 2.0 + 1e-5) and np.all(scale <= 1.0)
    noisy, _ = SmashedDP(2.0, 1.5).privatize(a, np.random.default_rng(2))
    noise = noisy.astype(np.float64) - clipped.astype(np.float64)
    # sample variance of N = 160000 Gaussian draws: relative SD sqrt(2/N); 6 SDs -> false alarm < 1e-8
    n = noise.size
    assert abs(noise.var() / (1.5 * 2.0) ** 2 - 1) < 6 * math.sqrt(2 / n)
    with pytest.raises(ConfigError):
        SmashedDP(0.0, 1.0)
    with pytest.raises(ConfigError):
        SmashedDP(1.0, -1.0)


@pytest.mark.parametrize(("sigma", "epochs"), [(4.0, 10), (8.0, 3)])
def test_epsilon_against_the_composed_accountant(sigma: float, epochs: int) -> None:
    # independent route: dp_accounting's PLD composing the E releases (multiplier σ/2 each) one by one
    expected = dpsgd_epsilon(sampled_gaussian_event(sigma / 2, 1.0, epochs), 1e-5)
    assert SmashedDP(2.0, sigma).epsilon(epochs, 1e-5) == pytest.approx(expected, rel=2e-3)
    assert SmashedDP(2.0, 0.0).epsilon(epochs, 1e-5) is None


def test_training_over_http_and_the_inversion_attack(server_url) -> None:  # type: ignore[no-untyped-def]
    server, url = server_url
    study = SplitStudy(epochs=3, seed=3)
    data = load_digits_split(study.seed)
    clear = run_split(study, data, url, 0.0)
    batches = math.ceil(len(data["x_train"]) / study.batch_size)
    assert server.steps == study.epochs * batches and server.examples == study.epochs * len(data["x_train"])
    assert clear["accuracy"] > 0.5  # 10 classes, chance 0.1
    client = clear["_client"]
    # the activations alone are 4 bytes × 16 per example per epoch; the predict calls come after
    assert client.bytes_up > clear["bytes_up"] > study.epochs * len(data["x_train"]) * 16 * 4
    observed = fetch_observed(url)
    assert observed.shape == (len(data["x_test"]), 16)  # the server saw the test activations, not the inputs
    attack_clear = run_attack(client, observed, data, study.seed, mlp=False)
    # without noise the server reconstructs the inputs far better than guessing the mean image
    assert attack_clear["mse"] < 0.6 * attack_clear["mse_baseline"]
    assert attack_clear["ssim"] > attack_clear["ssim_baseline"] + 0.1

    noisy_server = SplitServer(16, 10, 0.3, record=True)
    uvi, url2, thread = serve_in_thread(create_app(noisy_server), lifespan="off")
    try:
        noisy = run_split(study, data, url2, 4.0)
        attack_noisy = run_attack(noisy["_client"], fetch_observed(url2), data, study.seed, mlp=False)
    finally:
        uvi.should_exit = True
        thread.join(30)
    # with σ = 4 (ε ≈ 3.7 per example for 3 epochs) the reconstruction is no better than the mean image
    assert noisy["epsilon_per_example"] < 4
    assert attack_noisy["mse"] > 0.95 * attack_noisy["mse_baseline"]


def test_the_server_refuses_bad_messages(server_url) -> None:  # type: ignore[no-untyped-def]
    _, url = server_url

    def post(body: bytes) -> int:
        return urllib_transport(HttpRequest("POST", url + "/split/v1/train", body, {}, 10.0)).status

    a = np.zeros((2, 16), np.float32)
    assert post(b"garbage") == 400
    assert post(encode_message({}, {"smashed": a, "labels": np.array([0, 10])})) == 400
    assert post(encode_message({}, {"smashed": np.zeros((2, 5), np.float32), "labels": np.array([0, 1])})) == 400
    assert post(encode_message({}, {"smashed": a * np.nan, "labels": np.array([0, 1])})) == 400
    assert post(encode_message({}, {"smashed": a, "labels": np.array([0, 1])})) == 200
    client = SplitClient(url, BottomModel.init(64, 5, np.random.default_rng(0)), SmashedDP(1.0, 0.0))
    with pytest.raises(SplitServerError, match="HTTP 400"):
        client.train_epoch(np.zeros((4, 64)), np.zeros(4, np.int64), 4, 0.1, np.random.default_rng(0))
    dead = SplitClient("http://127.0.0.1:9", BottomModel.init(64, 16, np.random.default_rng(0)), SmashedDP(1.0, 0.0))
    with pytest.raises(SplitServerError, match="cannot be reached"):
        dead.info()


def test_cli_train_and_run(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    server = SplitServer(16, 10, 0.3, record=False)
    uvi, url, thread = serve_in_thread(create_app(server), lifespan="off")
    try:
        assert main(["split", "train", "--server", url, "--epochs", "1", "--ridge-only", "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert row["width"] == 16 and row["epsilon_per_example"] is None and row["bytes_up"] > 0
        assert main(["split", "train", "--server", url, "--epochs", "1", "--attack"]) == 2
        assert "--record" in capsys.readouterr().err
    finally:
        uvi.should_exit = True
        thread.join(30)
    plot = tmp_path / "split.png"
    argv = ["split", "run", "--noise-multipliers", "0,2", "--epochs", "1", "--fl-rounds", "1", "--ridge-only", "--json"]
    assert main([*argv, "--plot", str(plot)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["noise_multiplier"] for r in out["split"]] == [0.0, 2.0]
    assert out["split"][1]["epsilon_per_example"] == pytest.approx(SmashedDP(2.0, 2.0).epsilon(1, 1e-5))
    assert out["fl"]["bytes_up"] > 0 and "attack" in out["split"][0]
    assert plot.stat().st_size > 1000


def test_ldp_split_serve_runs_the_server_half(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s:  # a free port, released for the server to take
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "ldp_cli.main", "split", "serve", "--port", str(port), "--width", "8", "--record"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                info = SplitClient(url, BottomModel.init(64, 8, np.random.default_rng(0)), SmashedDP(1.0, 0.0)).info()
                break
            except SplitServerError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "ldp split serve did not answer within 60 s"
                time.sleep(0.2)
        assert info["width"] == 8 and info["record"] is True and info["steps"] == 0
        client = SplitClient(url, BottomModel.init(64, 8, np.random.default_rng(0)), SmashedDP(1.0, 0.5))
        rng = np.random.default_rng(1)
        client.train_epoch(rng.random((40, 64)), rng.integers(0, 10, 40), 20, 0.1, rng)
        assert client.info()["steps"] == 2 and client.info()["examples"] == 40
    finally:
        proc.terminate()
        proc.wait(30)
