"""The split-learning study (``ldp split run``; docs/SPLIT.md): split learning over a real HTTP server
at several noise levels on the activations, the inversion attack against each, and federated learning
on the same task beside it.

Data: scikit-learn's ``load_digits`` (8×8 images, pixels scaled to [0, 1]), offline, split by a seed
into the client's training set, its test set, and the attacker's auxiliary set. The model is the same
in both settings: 64 → ``width`` (ReLU, the cut layer) → 10 (softmax); in split learning the client
holds the first layer, the server the second; in FL every client holds both
(:class:`ldp_core.fl.MLP`, FedAvg by :func:`ldp_core.fl.train_client`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from client_sdk.split.client import BottomModel, SplitClient
from ldp_core.fl.models import MLP, accuracy
from ldp_core.fl.protocol import encode_upload_binary, make_upload
from ldp_core.fl.training import LocalTraining, RoundConfig
from ldp_core.split.dp import SmashedDP
from ldp_core.split.wire import decode_message

__all__ = ["SplitStudy", "load_digits_split", "run_split", "run_attack", "run_fl", "run_study", "plot_study"]


@dataclasses.dataclass(frozen=True)
class SplitStudy:
    """The task and training settings shared by split learning and FL."""

    width: int = 16
    epochs: int = 10
    batch_size: int = 32
    learning_rate: float = 0.3
    clip: float = 2.0
    delta: float = 1e-5
    fl_clients: int = 10
    fl_rounds: int = 10
    seed: int = 0
    #: the attacker also tries a multi-layer perceptron as inverse model (off: ridge regressions only, faster)
    attack_mlp: bool = True


def load_digits_split(seed: int) -> dict[str, np.ndarray]:
    """Digits scaled to [0, 1]: 55% the client's training data, 20% its test data, 25% the attacker's."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data / 16.0).astype(np.float64)
    y = d.target.astype(np.int64)
    order = np.random.default_rng([seed, 7]).permutation(len(x))
    a, b = int(0.55 * len(x)), int(0.75 * len(x))
    tr, te, aux = order[:a], order[a:b], order[b:]
    return {"x_train": x[tr], "y_train": y[tr], "x_test": x[te], "y_test": y[te], "x_aux": x[aux]}


def run_split(study: SplitStudy, data: dict[str, np.ndarray], url: str, noise_multiplier: float) -> dict[str, Any]:
    """Train the client half against the server at ``url``; test accuracy, ε, bytes, and the client."""
    rng = np.random.default_rng([study.seed, 11])
    dp = SmashedDP(study.clip, noise_multiplier)
    client = SplitClient(url, BottomModel.init(data["x_train"].shape[1], study.width, rng), dp)
    t0 = time.monotonic()
    losses = [
        client.train_epoch(data["x_train"], data["y_train"], study.batch_size, study.learning_rate, rng)
        for _ in range(study.epochs)
    ]
    train_bytes = (client.bytes_up, client.bytes_down)
    pred = client.predict(data["x_test"], rng)
    eps = dp.epsilon(study.epochs, study.delta)
    return {
        "noise_multiplier": noise_multiplier,
        "clip": study.clip,
        "epsilon_per_example": eps,
        "epsilon_per_inference": dp.epsilon(1, study.delta),
        "accuracy": float(np.mean(pred == data["y_test"])),
        "loss_last_epoch": losses[-1],
        "bytes_up": train_bytes[0],
        "bytes_down": train_bytes[1],
        "seconds": time.monotonic() - t0,
        "_client": client,
        "_rng": rng,
    }


def run_attack(
    client: SplitClient, observed: np.ndarray, data: dict[str, np.ndarray], seed: int, mlp: bool = True
) -> dict[str, Any]:
    """The server's inversion attack on ``observed`` (what it received for the test inputs, in order):
    the inverse model is fitted on the auxiliary inputs' activations through the client's release path."""
    from estimator.split.attack import fit_inverse, reconstruction_errors

    aux_smashed, _, _ = client.smash(data["x_aux"], np.random.default_rng([seed, 13]))
    inverse = fit_inverse(aux_smashed, data["x_aux"], seed, mlp=mlp)
    recon = np.asarray(inverse.predict(np.asarray(observed, dtype=np.float64)))
    out: dict[str, Any] = reconstruction_errors(data["x_test"], recon, data["x_aux"])
    out["inverse_model"] = inverse.name
    out["_recon"] = np.clip(recon, 0, 1)
    return out


def run_fl(study: SplitStudy, data: dict[str, np.ndarray]) -> dict[str, Any]:
    """FedAvg of the same model over ``fl_clients`` clients (the training data split evenly), one local
    epoch per round; bytes: each round each client downloads the float32 model and uploads its update in
    the project's binary upload format (no SecAgg, no compression)."""
    from ldp_core.fl.client_round import train_client

    model = MLP(data["x_train"].shape[1], study.width, 10, activation="relu")
    rng = np.random.default_rng([study.seed, 17])
    params = model.init_params(rng)
    parts = np.array_split(rng.permutation(len(data["x_train"])), study.fl_clients)
    up = down = 0
    training = LocalTraining(epochs=1, batch_size=study.batch_size, learning_rate=study.learning_rate)
    for r in range(study.fl_rounds):
        cfg = RoundConfig(round=r, params=params, training=training)
        total = np.zeros_like(params)
        weight = 0
        for c, idx in enumerate(parts):
            u = train_client(model, cfg, data["x_train"][idx], data["y_train"][idx], rng, f"c{c}")
            down += 4 * model.num_params
            payload = {"vector": u.delta, "num_examples": u.num_examples}
            up += len(encode_upload_binary(make_upload("split-vs-fl", r, "update", f"c{c}", payload)))
            total += u.num_examples * u.delta
            weight += u.num_examples
        params = (params + total / weight).astype(np.float32)
    return {
        "accuracy": accuracy(model, params, data["x_test"], data["y_test"]),
        "clients": study.fl_clients,
        "rounds": study.fl_rounds,
        "params": model.num_params,
        "bytes_up": up,
        "bytes_down": down,
        "server_sees": "each client's model update (64·w + w + 10·w + 10 floats) per round; with SecAgg only their sum",
    }


def fetch_observed(url: str) -> np.ndarray:
    """The activations the server recorded from ``predict`` (a server started with ``record``)."""
    from client_sdk.upload.uploader import HttpRequest, urllib_transport

    resp = urllib_transport(HttpRequest("GET", url.rstrip("/") + "/split/v1/observed", None, {}, 30.0))
    if resp.status != 200:
        raise ValueError(f"the server does not share what it saw (HTTP {resp.status}): start it with --record")
    return decode_message(resp.body)[1]["smashed"]


def run_study(study: SplitStudy, noise_multipliers: Sequence[float], fl: bool = True) -> dict[str, Any]:
    """For each noise multiplier: a fresh server on 127.0.0.1 (a free port) with recording, split
    training over HTTP, test accuracy, ε, bytes, and the inversion attack on the test activations."""
    from estimator.split.server import SplitServer, create_app
    from simulator.stack import serve_in_thread

    data = load_digits_split(study.seed)
    rows = []
    examples: dict[str, Any] = {"x": data["x_test"][:8].tolist()}
    for nm in noise_multipliers:
        server = SplitServer(study.width, 10, study.learning_rate, record=True)
        uvi, url, thread = serve_in_thread(create_app(server), lifespan="off")
        try:
            row = run_split(study, data, url, nm)
            observed = fetch_observed(url)
        finally:
            uvi.should_exit = True
            thread.join(30)
        client = row.pop("_client")
        row.pop("_rng")
        attack = run_attack(client, observed, data, study.seed, study.attack_mlp)
        examples[f"sigma={nm:g}"] = attack.pop("_recon")[:8].tolist()
        row["attack"] = attack
        row["server_steps"] = server.steps
        rows.append(row)
    out: dict[str, Any] = {
        "study": dataclasses.asdict(study),
        "data": {k: int(len(v)) for k, v in data.items() if k.startswith("x_")},
        "split": rows,
        "server_sees_split": "every example's clipped, noised cut-layer activations each epoch and at inference, "
        "and every training label",
        "_examples": examples,
    }
    if fl:
        out["fl"] = run_fl(study, data)
    return out


def plot_study(result: dict[str, Any], path: str) -> None:
    """Accuracy and reconstruction error against σ (FL's accuracy as a line), and the test images with
    their reconstructions at the smallest and largest σ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["split"]
    sig = [r["noise_multiplier"] for r in rows]
    fig = plt.figure(figsize=(9, 7.5))
    ax1 = fig.add_axes((0.08, 0.6, 0.38, 0.32))
    ax1.plot(sig, [r["accuracy"] for r in rows], marker="o", label="split learning")
    if "fl" in result:
        ax1.axhline(result["fl"]["accuracy"], color="k", linestyle="--", label="FedAvg (no DP)")
    ax1.set_xlabel("σ on the activations")
    ax1.set_ylabel("test accuracy")
    ax1.legend(fontsize=8)
    ax2 = fig.add_axes((0.58, 0.6, 0.38, 0.32))
    ax2.plot(sig, [r["attack"]["mse"] for r in rows], marker="o", label="inversion MSE")
    ax2.axhline(rows[0]["attack"]["mse_baseline"], color="grey", linestyle="--", label="guess the mean image")
    ax2.set_xlabel("σ on the activations")
    ax2.set_ylabel("reconstruction MSE")
    ax2.legend(fontsize=8)
    ex = result.get("_examples", {})
    keys = [k for k in ex if k != "x"]
    if keys:
        lines = [("input", ex["x"]), (keys[0], ex[keys[0]]), (keys[-1], ex[keys[-1]])]
        for i, (name, imgs) in enumerate(lines):
            for j, img in enumerate(imgs[:8]):
                ax = fig.add_axes((0.08 + j * 0.111, 0.33 - i * 0.15, 0.1, 0.13))
                ax.imshow(np.asarray(img).reshape(8, 8), cmap="gray_r", vmin=0, vmax=1)
                ax.set_xticks([])
                ax.set_yticks([])
                if j == 0:
                    ax.set_ylabel(name, fontsize=7)
    fig.suptitle("split learning on digits: accuracy and activation inversion")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_against(study: SplitStudy, url: str, noise_multiplier: float, attack: bool) -> dict[str, Any]:
    """``ldp split train``: the client half on the digits task against a running server at ``url``
    (its width and classes read from ``/split/v1/info``); with ``attack``, the inversion attack on what
    the server recorded (a server started with ``--record``)."""
    from ldp_core.errors import ConfigError

    data = load_digits_split(study.seed)
    info = SplitClient(url, BottomModel(np.zeros((0, 0)), np.zeros(0)), SmashedDP(1.0, 0.0)).info()
    if info.get("classes") != 10:
        raise ConfigError(f"the digits task has 10 classes, the server at {url} has {info.get('classes')}")
    study = dataclasses.replace(study, width=int(info["width"]))
    already = 0
    if attack:
        if not info.get("record"):
            raise ConfigError("--attack needs a server started with --record (it shares what it saw)")
        already = len(fetch_observed(url))
    row = run_split(study, data, url, noise_multiplier)
    client = row.pop("_client")
    row.pop("_rng")
    row["width"] = study.width
    row["epochs"] = study.epochs
    row["examples"] = len(data["x_train"])
    if attack:
        observed = fetch_observed(url)[already:]
        result = run_attack(client, observed, data, study.seed, study.attack_mlp)
        result.pop("_recon")
        row["attack"] = result
    return row
