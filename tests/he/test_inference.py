"""Private inference (estimator.he.inference): the server sees no secret key and computes the model."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.he.data import gaussian_classes
from estimator.he.inference import InferenceClient, InferenceServer, train_square_mlp


@pytest.fixture(scope="module")
def trained():
    rng = np.random.default_rng(3)
    X, y = gaussian_classes(1500, 32, 10, rng, separation=0.7)
    return train_square_mlp(X[:1200], y[:1200], 8, rng, steps=200), X[1200:]


@pytest.fixture(scope="module")
def parties(trained):
    client = InferenceClient()
    return client, InferenceServer(trained[0], client.public_context())


def test_encrypted_logits_match_plaintext(trained, parties):
    model, Xt = trained
    client, server = parties
    for x in Xt[:2]:
        logits = client.decrypt(server.evaluate(client.encrypt(x)))
        ref = model.logits(x)
        # CKKS at Δ = 2^36 after three rescalings: errors of order 1e-4 on logits of order 10 (measured
        # 6e-4 at most over 20 inputs); 1e-2 leaves a wide margin and still separates the classes
        assert np.abs(logits - ref).max() < 1e-2
        assert logits.argmax() == ref.argmax()


def test_server_context_has_no_secret_key(trained, parties):
    _, Xt = trained
    client, server = parties
    assert not server.context.is_private()
    blob = client.encrypt(Xt[0])
    import tenseal as ts

    vec = ts.ckks_vector_from(server.context, blob)
    with pytest.raises(ValueError):
        vec.decrypt()  # the server cannot decrypt the input it computes on


def test_server_refuses_a_private_context(trained, parties):
    client, _ = parties
    with pytest.raises(ValueError, match="secret key"):
        InferenceServer(trained[0], client.context.serialize(save_secret_key=True))
