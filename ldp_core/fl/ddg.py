"""The distributed discrete Gaussian, device side and its decoder (Kairouz, Liu, Steinke, "The Distributed
Discrete Gaussian Mechanism for Federated Learning with Secure Aggregation", ICML 2021; below "KLS21").

With central noise the server unmasks the exact sum of the clipped updates and adds the noise itself, so
no DP holds against the server operator. Here every one of the round's n devices adds a share of the
noise *before* secure aggregation, in the integers, and the server only ever unmasks a noised sum.

Encoding of a device's update x ∈ R^d (:meth:`DDGSpec.encode`, KLS21 Algorithm 1), all in one spec both
sides share:

1. clip to L2 norm c;
2. pad with zeros to D = 2^⌈log₂ d⌉ and rotate: x ↦ H·diag(ξ)·x / √D, H the D×D Sylvester Hadamard matrix
   and ξ ∈ {±1}^D drawn from the round's *public* rotation seed (the server inverts the rotation). An
   orthogonal map keeps norms, so it does not touch the privacy argument; it spreads the vector evenly
   over the coordinates so that the modular sum rarely wraps;
3. scale by 1/γ (γ the granularity) and round each coordinate stochastically to ⌊v⌋ or ⌊v⌋ + 1 (unbiased),
   *conditionally*: redraw until ‖rounded‖₂² ≤ Δ² = min(c²/γ² + D/4 + √(2 ln(1/β))·(c/γ + √D/2),
   (c/γ + √D)²) (KLS21 Thm. 1: one draw passes with probability at least 1 − β, so the expected number
   of draws is below 1/(1 − β)). So every device's integer vector has norm at most Δ whatever happens;
4. add N_Z(0, σ_ℓ²)^D with σ_ℓ = s / (γ √n): the n shares sum to variance n·σ_ℓ² = (s/γ)², i.e. the noise
   s = z·c of the central mechanism in the original units. Exact sampler of :mod:`ldp_core.noise`,
   drawn from the generator passed in: on a device :func:`ldp_core.randomness.secure_generator`,
   because a server that could predict a device's noise could subtract it;
5. reduce mod m = 2^bits; SecAgg masks mod m (:meth:`ldp_core.fl.secagg.SecAggClient.masked_input`
   with ``bits``), so the server sees uniform words and unmasks Σ (mod m) only.

Decoding (:meth:`DDGSpec.decode_sum`): read the unmasked sum mod m as centred integers in [−m/2, m/2),
multiply by γ, undo the rotation, drop the padding. Unless a coordinate wrapped (modular clipping,
bounded by :meth:`DDGSpec.modular_clipping_bound`), this is Σ clip(x_u) + γ·(rounding errors) +
γ·(the n noise shares), unbiased up to the conditional rounding's rejection.

The accounting (the sum of n discrete Gaussians is not itself a discrete Gaussian: KLS21 Prop. 14's τ
term) is on the server side, :mod:`estimator.fl.ddg_accounting`.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ldp_core.fl.errors import SecAggError
from ldp_core.noise import discrete_gaussian, discrete_gaussian_variance, sigma2_used

__all__ = ["DDGSpec", "rotation_signs", "rotate", "unrotate", "padded_dimension", "MAX_ROUNDING_TRIES"]

#: Conditional rounding gives up (and the device sends nothing) after this many draws: each passes with
#: probability ≥ 1 − β, so with β = e^{-1/2} the chance of reaching it is below 0.61^1000.
MAX_ROUNDING_TRIES = 1000


def padded_dimension(d: int) -> int:
    """D = the smallest power of two ≥ d (the Hadamard transform's length)."""
    if d < 1:
        raise SecAggError(f"the vector length must be >= 1, got {d}")
    return 1 << (d - 1).bit_length()


def rotation_signs(seed: int, dim: int) -> np.ndarray:
    """ξ ∈ {±1}^dim from the public rotation seed (a seeded PCG64: the signs are public, nothing
    secret depends on them; privacy holds for *any* signs, the rotation being orthogonal)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SecAggError(f"the rotation seed must be an integer >= 0, got {seed!r}")
    bits = np.random.default_rng(seed).integers(0, 2, size=dim)
    return (1 - 2 * bits).astype(np.float64)


def _fwht(a: np.ndarray) -> np.ndarray:
    """a·H along the last axis (H the Sylvester Hadamard matrix, the length a power of two), vectorized
    butterflies."""
    out = np.array(a, dtype=np.float64, copy=True)
    n = out.shape[-1]
    h = 1
    while h < n:
        v = out.reshape(out.shape[:-1] + (-1, 2, h))
        top = v[..., 0, :] + v[..., 1, :]
        bot = v[..., 0, :] - v[..., 1, :]
        v[..., 0, :] = top
        v[..., 1, :] = bot
        h *= 2
    return out


def rotate(x: np.ndarray, seed: int) -> np.ndarray:
    """H·diag(ξ)·x / √D for x already padded to D, along the last axis (orthonormal: norms are kept)."""
    dim = x.shape[-1]
    return _fwht(x * rotation_signs(seed, dim)) / math.sqrt(dim)


def unrotate(y: np.ndarray, seed: int) -> np.ndarray:
    """The inverse of :func:`rotate`: diag(ξ)·H·y / √D (H is symmetric and H·H = D·I)."""
    dim = y.shape[-1]
    return _fwht(y) / math.sqrt(dim) * rotation_signs(seed, dim)


def _positive(name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise SecAggError(f"{name} must be a finite number > 0, got {v!r}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class DDGSpec:
    """One round's distributed discrete Gaussian parameters, public and shared by devices and server.

    ``clip_norm`` c; ``noise_stddev`` s: the total noise's standard deviation per coordinate in the
    update's units (z·c for noise multiplier z); ``clients`` n: how many devices each add a share (the
    round's sample: shares of devices that drop are missing, so the noise actually summed is smaller,
    see :mod:`estimator.fl.ddg_accounting`); ``dim`` d; ``bits``: the ring Z_m, m = 2^bits, 2 ≤ bits ≤ 32
    (the SecAgg words are 32-bit); ``gamma`` γ; ``beta`` β of the conditional rounding (KLS21 use e^{-1/2}).
    Use :meth:`for_bits` to pick γ from the bit width."""

    clip_norm: float
    noise_stddev: float
    clients: int
    dim: int
    bits: int
    gamma: float
    beta: float = math.exp(-0.5)

    def __post_init__(self) -> None:
        object.__setattr__(self, "clip_norm", _positive("clip_norm", self.clip_norm))
        object.__setattr__(self, "noise_stddev", _positive("noise_stddev", self.noise_stddev))
        object.__setattr__(self, "gamma", _positive("gamma", self.gamma))
        for name, low, high in (("clients", 1, 2**20), ("dim", 1, 2**30), ("bits", 2, 32)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise SecAggError(f"{name} must be an integer in [{low}, {high}], got {v!r}")
        b = self.beta
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
            raise SecAggError(f"beta must be a number in [0, 1), got {b!r}")
        if self.modulus // 2 <= self.clients:
            raise SecAggError(
                f"{self.bits} bits per coordinate leave no room for {self.clients} clients' rounding: "
                f"need 2^(bits-1) > n; use more bits"
            )
        if self.local_sigma < 0.5:
            raise SecAggError(
                f"each device's share of the noise would have σ = {self.local_sigma:.3g} < 1/2 integer units, "
                "below the range of KLS21's analysis: lower gamma (more bits) or raise the noise"
            )

    @classmethod
    def for_bits(
        cls,
        clip_norm: float,
        noise_stddev: float,
        clients: int,
        dim: int,
        bits: int,
        k_stddevs: float = 6.0,
        beta: float = math.exp(-0.5),
    ) -> DDGSpec:
        """γ such that k standard deviations of a coordinate of the round's sum fit in the ring:
        γ = k·σ̂ / (m/2 − n), with σ̂² = (n c)²/D + s² (a rotated coordinate of Σ clip(x_u) is sub-Gaussian
        with variance proxy ‖Σ x_u‖²/D ≤ (nc)²/D; the noise adds s²) and n for the rounding (each device's
        coordinate moves by less than 1 integer unit). A function of public parameters only. k = 6 keeps :meth:`modular_clipping_bound` near 2D·e^{-18}."""
        c = _positive("clip_norm", clip_norm)
        s = _positive("noise_stddev", noise_stddev)
        k = _positive("k_stddevs", k_stddevs)
        dd = padded_dimension(dim)
        room = (1 << (bits - 1)) - clients
        if room <= 0:
            raise SecAggError(f"{bits} bits per coordinate leave no room for {clients} clients: use more bits")
        sigma_hat = math.sqrt((clients * c) ** 2 / dd + s**2)
        return cls(c, s, clients, dim, bits, k * sigma_hat / room, beta)

    # -- public figures -------------------------------------------------------------------------
    @property
    def padded_dim(self) -> int:
        return padded_dimension(self.dim)

    @property
    def modulus(self) -> int:
        return 1 << self.bits

    @property
    def local_sigma(self) -> float:
        """σ_ℓ = s / (γ √n): each device's discrete Gaussian parameter, in integer units."""
        return self.noise_stddev / (self.gamma * math.sqrt(self.clients))

    @property
    def local_sigma2(self) -> float:
        """σ_ℓ² as the exact sampler uses it (rounded up, relative change < 2^-20)."""
        return float(sigma2_used(self.local_sigma))

    @property
    def norm_bound_sq(self) -> float:
        """Δ² (integer units): every device's rounded vector has ‖·‖₂² ≤ Δ² (KLS21 Thm. 1)."""
        cg, dd = self.clip_norm / self.gamma, self.padded_dim
        root = math.sqrt(2.0 * math.log(1.0 / self.beta)) if self.beta > 0 else math.inf
        return min(cg**2 + dd / 4.0 + root * (cg + math.sqrt(dd) / 2.0), (cg + math.sqrt(dd)) ** 2)

    def noise_variance(self, shares: int | None = None) -> float:
        """Variance per coordinate of the summed noise in the update's units, γ²·k·Var N_Z(0, σ_ℓ²), for
        ``shares`` = k devices (default n)."""
        k = self.clients if shares is None else shares
        return self.gamma**2 * k * discrete_gaussian_variance(self.local_sigma2)

    def modular_clipping_bound(self) -> float:
        """An upper bound on the probability that some coordinate of the round's integer sum leaves
        [−m/2, m/2) (and wraps): a coordinate is |G + N| + n at most, G the rotated sum of clipped updates
        (sub-Gaussian, variance proxy (nc/γ)²/D), N the summed noise (a sum of discrete Gaussians,
        sub-Gaussian with proxy (s/γ)², as each N_Z(0, σ²) is σ²-sub-Gaussian: Canonne, Kamath, Steinke 2020), n the rounding; so
        P ≤ D·2·exp(−(m/2 − n)²/(2((nc/γ)²/D + n σ_ℓ²))) by the union bound."""
        dd = self.padded_dim
        room = self.modulus / 2.0 - self.clients
        proxy = (self.clients * self.clip_norm / self.gamma) ** 2 / dd + self.clients * self.local_sigma2
        return min(1.0, dd * 2.0 * math.exp(-(room**2) / (2.0 * proxy)))

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)

    # -- device ---------------------------------------------------------------------------------
    def encode(self, x: np.ndarray, rng: np.random.Generator, rotation_seed: int) -> np.ndarray:
        """The device's words in [0, m) (uint32, length D) for its update ``x`` (steps 1–5 of the module
        docstring); a 2-D ``x`` encodes each row as one device (shape (k, D); simulations). ``rng`` draws
        the rounding and the noise: a CSPRNG generator on a device."""
        r = self.rounded(x, rng, rotation_seed)
        noise = discrete_gaussian(self.local_sigma, r.size, rng).reshape(r.shape)
        return np.mod(r + noise, self.modulus).astype(np.uint32)

    def scaled(self, x: np.ndarray, rotation_seed: int) -> np.ndarray:
        """Steps 1–3 before rounding: clip(x), padded, rotated, divided by γ (floats, length D per row)."""
        v = np.array(x, dtype=np.float64, ndmin=2)
        if v.ndim != 2 or v.shape[1] != self.dim or not np.all(np.isfinite(v)):
            raise SecAggError(f"the update must be {self.dim} finite numbers, got shape {np.shape(x)}")
        norm = np.linalg.norm(v, axis=1, keepdims=True)
        v *= np.minimum(1.0, self.clip_norm / np.maximum(norm, 1e-300))
        padded = np.zeros((v.shape[0], self.padded_dim))
        padded[:, : self.dim] = v
        out = rotate(padded, rotation_seed) / self.gamma
        return out if np.ndim(x) == 2 else out[0]

    def rounded(self, x: np.ndarray, rng: np.random.Generator, rotation_seed: int) -> np.ndarray:
        """The conditionally rounded integer vector (int64, length D per row, ‖·‖₂² ≤ :attr:`norm_bound_sq`):
        each coordinate ⌊v⌋ + Bernoulli(v − ⌊v⌋), the whole vector redrawn until it meets the bound."""
        scaled = np.array(self.scaled(x, rotation_seed), ndmin=2)
        floor = np.floor(scaled)
        frac = scaled - floor
        out = np.empty_like(floor)
        pending = np.arange(floor.shape[0])
        bound = self.norm_bound_sq
        for _ in range(MAX_ROUNDING_TRIES):
            r = floor[pending] + (rng.random(frac[pending].shape) < frac[pending])
            ok = np.einsum("ij,ij->i", r, r) <= bound
            out[pending[ok]] = r[ok]
            pending = pending[~ok]
            if not pending.size:
                break
        else:
            raise SecAggError(f"conditional rounding failed {MAX_ROUNDING_TRIES} times: the bound is inconsistent")
        res = out.astype(np.int64)
        return res if np.ndim(x) == 2 else res[0]

    # -- server ---------------------------------------------------------------------------------
    def decode_sum(self, total: np.ndarray, rotation_seed: int) -> np.ndarray:
        """The float sum (length d) from the unmasked ring sum (any integer array of length D, read mod m;
        2-D: one sum per row)."""
        t = np.asarray(total)
        if t.ndim not in (1, 2) or t.shape[-1] != self.padded_dim or t.dtype.kind not in "iu":
            raise SecAggError(f"the ring sum must be {self.padded_dim} integers, got {t.dtype} {t.shape}")
        m = self.modulus
        centred = np.mod(t.astype(np.int64), m)
        centred = np.where(centred >= m // 2, centred - m, centred).astype(np.float64)
        return unrotate(centred * self.gamma, rotation_seed)[..., : self.dim]
