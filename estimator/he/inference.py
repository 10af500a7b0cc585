"""Private inference: the client encrypts its input, the server evaluates a small model on the
ciphertext and returns an encrypted result only the client can decrypt (TenSEAL's CKKS vectors).

The model is a one-hidden-layer network with a square activation (a polynomial, so it can be evaluated
under CKKS: CryptoNets, Gilad-Bachrach et al., ICML 2016), trained here in numpy by full-batch
gradient descent on a seeded Gaussian-mixture task. The server holds the weights in plaintext and the
client's *public* context (relinearisation and rotation keys, no secret key); it computes
``square(x·W1 + b1)·W2 + b2`` with TenSEAL's vector-matrix products. :func:`measure` times this next
to the same arithmetic on the plaintext input and reports the ciphertext expansion, to check the
usual claims (ciphertexts about 100× the plaintext, arithmetic 1,000× and more slower).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import numpy as np

from estimator.he.data import gaussian_classes

__all__ = ["SquareMLP", "train_square_mlp", "InferenceClient", "InferenceServer", "measure"]


@dataclasses.dataclass(frozen=True)
class SquareMLP:
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray

    def logits(self, X: np.ndarray) -> np.ndarray:
        return ((X @ self.W1 + self.b1) ** 2) @ self.W2 + self.b2

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.logits(X).argmax(axis=-1)


def train_square_mlp(
    X: np.ndarray, y: np.ndarray, hidden: int, rng: np.random.Generator, steps: int = 400, lr: float = 0.5
) -> SquareMLP:
    """Full-batch gradient descent on the mean softmax cross-entropy (+ 1e-4·‖W‖² weight decay)."""
    n, d = X.shape
    k = int(y.max()) + 1
    W1 = rng.normal(scale=1 / np.sqrt(d), size=(d, hidden))
    b1 = np.zeros(hidden)
    W2 = rng.normal(scale=1 / np.sqrt(hidden), size=(hidden, k))
    b2 = np.zeros(k)
    Y = np.eye(k)[y]
    for _ in range(steps):
        h = X @ W1 + b1
        a = h**2
        z = a @ W2 + b2
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        gz = (p - Y) / n
        gW2 = a.T @ gz + 2e-4 * W2
        gh = (gz @ W2.T) * 2 * h
        gW1 = X.T @ gh + 2e-4 * W1
        W1 -= lr * gW1
        b1 -= lr * gh.sum(0)
        W2 -= lr * gW2
        b2 -= lr * gz.sum(0)
    return SquareMLP(W1, b1, W2, b2)


def _ts() -> Any:
    try:
        import tenseal
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("private inference needs TenSEAL: pip install 'ldp-telemetry[pets]'") from e
    return tenseal


class InferenceClient:
    """Holds the CKKS secret key; sends the public context and encrypted inputs, decrypts results."""

    def __init__(self, poly_degree: int = 8192, coeff_bits: tuple[int, ...] = (50, 36, 36, 36, 50)) -> None:
        ts = _ts()
        self.context = ts.context(ts.SCHEME_TYPE.CKKS, poly_degree, coeff_mod_bit_sizes=list(coeff_bits))
        self.context.global_scale = 2.0**36
        self.context.generate_galois_keys()

    def public_context(self) -> bytes:
        """The context without its secret key: what the server receives (evaluation keys included)."""
        return self.context.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=True)

    def encrypt(self, x: np.ndarray) -> bytes:
        return self._vector(x).serialize()

    def _vector(self, x: np.ndarray) -> Any:
        return _ts().ckks_vector(self.context, np.asarray(x, dtype=np.float64).tolist())

    def decrypt(self, blobs: list[bytes]) -> np.ndarray:
        """The logits: the first slot of each returned ciphertext."""
        return np.asarray([_ts().ckks_vector_from(self.context, b).decrypt()[0] for b in blobs], dtype=np.float64)


class InferenceServer:
    """Holds the model in plaintext and the client's public context; sees only ciphertexts."""

    def __init__(self, model: SquareMLP, public_context: bytes) -> None:
        ts = _ts()
        self.model = model
        self.context = ts.context_from(public_context)
        if self.context.is_private():
            raise ValueError("the server must not receive the secret key")
        self._W1, self._W2 = model.W1.tolist(), model.W2.tolist()

    def evaluate(self, blob: bytes) -> list[bytes]:
        """One ciphertext per class logit. The output layer is one encrypted dot product per class:
        TenSEAL's vector-matrix product assumes zeros past a vector's length, which the first product
        does not leave (measured: logits off by up to 10), whereas a dot product masks them."""
        x = _ts().ckks_vector_from(self.context, blob)
        h = x.mm(self._W1) + self.model.b1.tolist()
        h.square_()
        return [(h.dot(col) + float(b)).serialize() for col, b in zip(self.model.W2.T.tolist(), self.model.b2)]


def measure(samples: int = 20, seed: int = 0, hidden: int = 16, features: int = 32) -> dict[str, Any]:
    """Train, then classify ``samples`` test inputs under encryption and in plaintext; sizes and times."""
    rng = np.random.default_rng(seed)
    X, y = gaussian_classes(4000 + samples, features, 10, rng, separation=0.5)
    model = train_square_mlp(X[:4000], y[:4000], hidden, rng)
    Xt, yt = X[4000:], y[4000:]
    client = InferenceClient()
    t0 = time.perf_counter()
    server = InferenceServer(model, client.public_context())
    setup_s = time.perf_counter() - t0
    he_s, plain_s, enc_s, dec_s, agree, errs = [], [], [], [], 0, []
    blobs: tuple[bytes, list[bytes]] = (b"", [])
    for i in range(samples):
        x = Xt[i]
        t = time.perf_counter()
        q = client.encrypt(x)
        enc_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        r = server.evaluate(q)
        he_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        logits = client.decrypt(r)
        dec_s.append(time.perf_counter() - t)
        reps = 200
        ref = model.logits(x)
        t = time.perf_counter()
        for _ in range(reps):
            model.logits(x)
        plain_s.append((time.perf_counter() - t) / reps)
        agree += int(logits.argmax() == ref.argmax())
        errs.append(float(np.abs(logits - ref).max()))
        blobs = (q, r)
    he_med, plain_med = statistics.median(he_s), statistics.median(plain_s)
    return {
        "model": f"{features}-{hidden}-10, square activation",
        "samples": samples,
        "plaintext_accuracy_test": float(np.mean(model.predict(X[4000:]) == yt)),
        "plaintext_accuracy_train": float(np.mean(model.predict(X[:4000]) == y[:4000])),
        "he_agrees_with_plaintext": agree / samples,
        "max_abs_logit_error": max(errs),
        "input_plaintext_bytes_float64": 8 * features,
        "input_plaintext_bytes_float32": 4 * features,
        "input_ciphertext_bytes": len(blobs[0]),
        "result_ciphertext_bytes": sum(len(b) for b in blobs[1]),
        "expansion_vs_float64": len(blobs[0]) / (8 * features),
        "expansion_vs_float32": len(blobs[0]) / (4 * features),
        "public_context_bytes": len(client.public_context()),
        "server_setup_s": setup_s,
        "he_eval_s_median": he_med,
        "plain_eval_s_median": plain_med,
        "slowdown": he_med / plain_med,
        "encrypt_s_median": statistics.median(enc_s),
        "decrypt_s_median": statistics.median(dec_s),
    }
