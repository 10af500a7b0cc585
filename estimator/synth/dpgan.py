"""A DP-GAN over one-hot tabular records (numpy, one-hidden-layer networks).

Only the discriminator sees real records, and it is trained by DP-SGD: each step keeps every record with
probability q (Poisson sampling), clips each kept record's gradient of its loss term −log D(x) to L2 norm C,
adds N(0, σ²C²) to the sum and divides by the expected batch qN (:func:`ldp_core.fl.dpsgd.privatize_sum`).
The discriminator's gradient on the generator's fake records is added unclipped: those records are a function
of the generator, which is itself a function of earlier private discriminators and of public noise, so that
term reads no real record. The generator is trained through the discriminator only (post-processing): the
whole run is T steps of the sampled Gaussian mechanism, SelfComposed(PoissonSampled(q, Gaussian(σ)), T),
accounted by the project's DP-SGD accountant (:mod:`ldp_core.fl.dpsgd_accounting`, dp_accounting's PLD),
ε per record under add/remove.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from estimator.synth.data import SynthError, Table
from ldp_core.fl.dpsgd import poisson_sample, privatize_sum
from ldp_core.privacy_events import sampled_gaussian_event

__all__ = ["GANConfig", "dpgan", "noise_for_epsilon", "gan_epsilon"]


@dataclasses.dataclass(frozen=True)
class GANConfig:
    """Training settings. ``noise_multiplier`` None: calibrated to the target ε; 0 with ``clip_norm`` None:
    the non-private GAN (no clipping, no noise, no ε)."""

    steps: int = 1500
    batch: int = 64
    latent: int = 16
    hidden: int = 64
    #: the discriminator's hidden width (None: ``hidden``); a smaller one has fewer coordinates to noise
    hidden_d: int | None = None
    lr_d: float = 2e-3
    lr_g: float = 2e-3
    clip_norm: float | None = 1.0
    noise_multiplier: float | None = None


def gan_epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "pld"
) -> float:
    """ε at ``delta`` of ``steps`` discriminator steps (the project's DP-SGD accountant)."""
    from ldp_core.fl.dpsgd_accounting import dpsgd_epsilon, quiet_rdp_warnings

    with quiet_rdp_warnings():
        return dpsgd_epsilon(
            sampled_gaussian_event(noise_multiplier, sample_rate, steps),
            delta,
            accountant=accountant,  # type: ignore[arg-type]
        )


def noise_for_epsilon(epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
    """The smallest σ (to 0.5 %) whose PLD ε is at most ``epsilon`` (bisection; RDP brackets it first)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise SynthError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    lo, hi = 0.3, 1.0
    while gan_epsilon(hi, sample_rate, steps, delta, "rdp") > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:
            raise SynthError(f"no noise multiplier reaches ε = {epsilon:g}")
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        if gan_epsilon(mid, sample_rate, steps, delta) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


class _Adam:
    def __init__(self, params: dict[str, np.ndarray], lr: float) -> None:
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        b1, b2 = 0.5, 0.999
        for k, g in grads.items():
            self.m[k] = b1 * self.m[k] + (1 - b1) * g
            self.v[k] = b2 * self.v[k] + (1 - b2) * g * g
            mh, vh = self.m[k] / (1 - b1**self.t), self.v[k] / (1 - b2**self.t)
            params[k] -= self.lr * mh / (np.sqrt(vh) + 1e-8)


class _Nets:
    def __init__(self, dim: int, blocks: list[tuple[int, int]], cfg: GANConfig, rng: np.random.Generator) -> None:
        h, z = cfg.hidden, cfg.latent
        hd = cfg.hidden_d or cfg.hidden
        self.blocks = blocks
        self.g = {
            "W1": rng.normal(0, 1 / math.sqrt(z), (z, h)),
            "b1": np.zeros(h),
            "W2": rng.normal(0, 1 / math.sqrt(h), (h, dim)),
            "b2": np.zeros(dim),
        }
        self.d = {
            "V1": rng.normal(0, 1 / math.sqrt(dim), (dim, hd)),
            "c1": np.zeros(hd),
            "v2": rng.normal(0, 1 / math.sqrt(hd), hd),
            "c2": np.zeros(1),
        }

    def generate(self, zs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pre = zs @ self.g["W1"] + self.g["b1"]
        hg = np.maximum(pre, 0.0)
        logits = hg @ self.g["W2"] + self.g["b2"]
        probs = np.empty_like(logits)
        for a, b in self.blocks:
            e = np.exp(logits[:, a:b] - logits[:, a:b].max(axis=1, keepdims=True))
            probs[:, a:b] = e / e.sum(axis=1, keepdims=True)
        return probs, hg, pre

    def discriminate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = x @ self.d["V1"] + self.d["c1"]
        h = np.where(a > 0, a, 0.2 * a)
        return h @ self.d["v2"] + self.d["c2"][0], h, a

    def d_backward(self, x: np.ndarray, ds: np.ndarray, h: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per-example pieces of ∂loss/∂D: (δ at the hidden layer, ds, h); sums come from weighting them."""
        da = (ds[:, None] * self.d["v2"][None, :]) * np.where(a > 0, 1.0, 0.2)
        return da, ds, h

    def d_grad(
        self, x: np.ndarray, da: np.ndarray, ds: np.ndarray, h: np.ndarray, w: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Σ_i w_i·∇_D loss_i."""
        wda, wds = da * w[:, None], ds * w
        return {"V1": x.T @ wda, "c1": wda.sum(axis=0), "v2": h.T @ wds, "c2": np.array([wds.sum()])}


def per_example_norms(x: np.ndarray, da: np.ndarray, ds: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Each example's discriminator-gradient L2 norm without building it: the first layer's gradient is the
    outer product x·δᵀ (norm ‖x‖·‖δ‖), its bias δ, the output layer's ds·h and ds."""
    return np.sqrt((np.sum(x * x, axis=1) + 1.0) * np.sum(da * da, axis=1) + ds * ds * (np.sum(h * h, axis=1) + 1.0))


def _clip_weights(x: np.ndarray, da: np.ndarray, ds: np.ndarray, h: np.ndarray, clip: float) -> np.ndarray:
    return np.minimum(1.0, clip / np.maximum(per_example_norms(x, da, ds, h), 1e-12))


def _flat(g: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([g[k].ravel() for k in ("V1", "c1", "v2", "c2")])


def _unflat(v: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, i = {}, 0
    for k in ("V1", "c1", "v2", "c2"):
        n = like[k].size
        out[k] = v[i : i + n].reshape(like[k].shape)
        i += n
    return out


def dpgan(
    table: Table,
    epsilon: float | None,
    delta: float,
    rng: np.random.Generator,
    *,
    rows: int | None = None,
    config: GANConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Table, dict[str, float | int | None]]:
    """Train the GAN on ``table`` and sample ``rows`` records. ``epsilon`` None (with ``config.clip_norm``
    None and noise 0) trains the non-private GAN. Returns the table and the run's privacy figures."""
    say = progress or (lambda _m: None)
    cfg = config or GANConfig()
    n = table.rows
    x_all = table.one_hot()
    sizes = table.shape
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    blocks = [(int(edges[i]), int(edges[i + 1])) for i in range(len(sizes))]
    q = min(1.0, cfg.batch / n)
    private = epsilon is not None
    if epsilon is not None:
        if cfg.clip_norm is None:
            raise SynthError("a private GAN needs a clip norm")
        sigma = (
            cfg.noise_multiplier
            if cfg.noise_multiplier is not None
            else noise_for_epsilon(epsilon, delta, q, cfg.steps)
        )
        say(f"noise multiplier σ = {sigma:.3f} for ε = {epsilon:g} over {cfg.steps} steps at q = {q:.4f}")
    else:
        sigma = 0.0
    nets = _Nets(x_all.shape[1], blocks, cfg, rng)
    opt_d, opt_g = _Adam(nets.d, cfg.lr_d), _Adam(nets.g, cfg.lr_g)
    for step in range(cfg.steps):
        # discriminator: the real term by DP-SGD, the fake term exactly
        idx = poisson_sample(n, q, rng)
        xr = x_all[idx]
        s, h, a = nets.discriminate(xr)
        da, ds, _ = nets.d_backward(xr, _sigmoid(s) - 1.0, h, a)
        if private:
            w = _clip_weights(xr, da, ds, h, cfg.clip_norm)  # type: ignore[arg-type]
            real = privatize_sum(_flat(nets.d_grad(xr, da, ds, h, w)), cfg.clip_norm, sigma, q * n, rng)  # type: ignore[arg-type]
        else:
            real = _flat(nets.d_grad(xr, da, ds, h, np.ones(len(idx)))) / max(1, len(idx))
        xf, _, _ = nets.generate(rng.normal(size=(cfg.batch, cfg.latent)))
        sf, hf, af = nets.discriminate(xf)
        daf, dsf, _ = nets.d_backward(xf, _sigmoid(sf), hf, af)
        wf = _clip_weights(xf, daf, dsf, hf, cfg.clip_norm) if private else np.ones(cfg.batch)  # type: ignore[arg-type]
        fake = _flat(nets.d_grad(xf, daf, dsf, hf, wf / cfg.batch))  # clipped alike, so neither term dominates
        opt_d.step(nets.d, _unflat(real + fake, nets.d))
        # generator: through the (private) discriminator, on public noise only
        zs = rng.normal(size=(cfg.batch, cfg.latent))
        probs, hg, pre = nets.generate(zs)
        sg, hd, ad = nets.discriminate(probs)
        dsg = (_sigmoid(sg) - 1.0) / cfg.batch
        dag = (dsg[:, None] * nets.d["v2"][None, :]) * np.where(ad > 0, 1.0, 0.2)
        dx = dag @ nets.d["V1"].T
        dlog = np.empty_like(dx)
        for lo, hi in blocks:
            p = probs[:, lo:hi]
            dlog[:, lo:hi] = p * (dx[:, lo:hi] - np.sum(p * dx[:, lo:hi], axis=1, keepdims=True))
        dh = (dlog @ nets.g["W2"].T) * (pre > 0)
        opt_g.step(nets.g, {"W1": zs.T @ dh, "b1": dh.sum(axis=0), "W2": hg.T @ dlog, "b2": dlog.sum(axis=0)})
        if (step + 1) % max(1, cfg.steps // 5) == 0:
            say(
                f"step {step + 1}/{cfg.steps}: D(real) loss {float(np.mean(_softplus(-s))) if len(s) else 0:.3f}, G loss {float(np.mean(_softplus(-sg))):.3f}"
            )
    m = rows or n
    probs, _, _ = nets.generate(rng.normal(size=(m, cfg.latent)))
    codes = np.empty((m, len(sizes)), dtype=np.int64)
    for j, (lo, hi) in enumerate(blocks):
        cum = np.cumsum(probs[:, lo:hi], axis=1)
        codes[:, j] = np.minimum((rng.random(m)[:, None] > cum).sum(axis=1), hi - lo - 1)
    eps = gan_epsilon(sigma, q, cfg.steps, delta) if private and sigma > 0 else (math.inf if private else None)
    return table.with_codes(codes), {
        "epsilon": eps,
        "delta": delta if private else None,
        "noise_multiplier": sigma,
        "clip_norm": cfg.clip_norm if private else None,
        "sample_rate": q,
        "steps": cfg.steps,
    }
