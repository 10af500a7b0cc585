"""DLG against a small CNN's shared gradient (estimator.attacks.dlg_torch); run with scripts/test-torch.

Criteria: an input is *recovered* when its relative error ‖x̂ − x‖/‖x‖ is below 5% (every pixel
recognisable); the attack *fails* when the error is above 0.9, within 10% of what returning zeros
scores (error 1). The optimisation is seeded (data, network, start and noise), so each figure is one
deterministic run of the attack."""

from __future__ import annotations

import numpy as np
import torch

from estimator.attacks.data import GaussianTask
from estimator.attacks.dlg_torch import cnn_dlg_case

torch.set_num_threads(1)


def _images(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    task = GaussianTask.make(64, 10, 4.0, rng)
    return task.sample(n, rng)


def test_dlg_recovers_one_clients_image_from_its_gradient_clipped_or_not() -> None:
    X, y = _images(1)
    for defence in ("none", "clip"):
        r = cnn_dlg_case(X, y, defence, np.random.default_rng(6), iterations=100)
        assert r["label_recovered"]
        assert r["dlg_error"] < 0.05, r


def test_noise_and_secagg_stop_dlg_on_the_cnn() -> None:
    X, y = _images(4)
    noisy = cnn_dlg_case(X[:1], y[:1], "noise", np.random.default_rng(6), noise_multiplier=0.1, iterations=100)
    assert noisy["dlg_error"] > 0.9, noisy
    summed = cnn_dlg_case(X, y, "secagg", np.random.default_rng(6), iterations=100)
    assert summed["clients"] == 4
    assert summed["dlg_error"] > 0.9, summed
