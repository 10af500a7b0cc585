"""Threshold (n-of-n) CKKS on Microsoft SEAL, through the SEAL API that TenSEAL ships (``tenseal.sealapi``).

No single party holds the secret key, so no single party can decrypt. The protocol is the multiparty
RLWE scheme of Mouchet, Troncoso-Pastoriza, Bossuat and Hubaux ("Multiparty homomorphic encryption from
ring-learning-with-errors", PETS 2021), the one OpenFHE and Lattigo implement (the collective
relinearisation key is in :mod:`ldp_core.he.relin`, t-of-n decryption in :mod:`ldp_core.he.shamir`):

* **Collective key generation.** Every key party i draws its own SEAL secret key s_i (SEAL's ternary
  sampler, through ``KeyGenerator``) and an error e_i (SEAL's centred-binomial sampler: the error of a
  SEAL public key of its own, which is never published), and publishes b_i = −a·s_i + e_i for the
  common random polynomial a, expanded with SHAKE-256 from a public seed (the "common reference string").
  The collective public key is (Σ b_i, a): an ordinary SEAL public key for the secret s = Σ s_i,
  which nobody ever holds.
* **Encryption** is SEAL's own (``Encryptor`` with that public key); the server computes on
  ciphertexts with SEAL's ``Evaluator`` (additions, products with plaintexts).
* **Threshold decryption.** For a ciphertext (c0, c1), party i returns d_i = c1·s_i + E_i, where E_i is
  flooding ("smudging") noise drawn uniformly from [−2^k, 2^k] with the operating system's CSPRNG;
  c0 + Σ d_i = Δ·m + e + Σ E_i decodes to m. A missing d_i leaves c1·s_i, a uniformly random
  polynomial, in the sum: the result is noise over the whole modulus (:class:`MissingShareError` is
  raised before that). One d_i alone is c1·s_i plus noise, which is as random as c1 is.

Polynomials are kept in SEAL's NTT (evaluation) form, one row per RNS prime, where products are
pointwise. SEAL's Python API reads coefficients but offers no setter, so objects are written by
building SEAL's own uncompressed serialisation (header ``5EA1``, version 4.x) and loading it with
SEAL's ``load``, which validates it against the context (:func:`_load_plaintext`, :func:`_load_ciphertext`).

What differs from OpenFHE's threshold CKKS (whose Python wheel ships only a CPython 3.10 extension,
docs/HE.md): n-of-n here (every key party must answer; :mod:`ldp_core.he.shamir` adds t-of-n); a
collective relinearisation key (:mod:`ldp_core.he.relin`) but no collective rotation keys, so products
of ciphertexts are available (sums of squares) but not sums across slots (a per-update norm).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import math
import os
import struct
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "ThresholdParams",
    "CkksContext",
    "KeyParty",
    "MissingShareError",
    "HeError",
    "collective_public_key",
    "combine",
]

RandomBytes = Callable[[int], bytes]


class HeError(ValueError):
    """A ciphertext, share or parameter that does not fit the context."""


class MissingShareError(HeError):
    """Threshold decryption asked without every key party's partial decryption."""


def _seal() -> Any:
    try:
        import tenseal.sealapi  # noqa: F401  (puts TenSEAL's SEAL extension, _sealapi_cpp, on the path)
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("threshold CKKS needs TenSEAL: pip install 'ldp-telemetry[pets]'") from e
    return importlib.import_module("_sealapi_cpp")  # the whole SEAL API, with util (NTT tables)


@dataclasses.dataclass(frozen=True)
class ThresholdParams:
    """CKKS parameters: N = 8192, so 4096 values per ciphertext; 128-bit security (SEAL's
    HomomorphicEncryption.org table: N = 8192 allows 218 bits of modulus, these use 200)."""

    poly_degree: int = 8192
    coeff_bits: tuple[int, ...] = (60, 40, 40, 60)
    #: Δ of the values encrypted (the fresh ciphertexts' scale)
    scale_bits: int = 55
    #: Δ of the plaintext weights the server multiplies by (no rescaling follows: results carry Δ·Δ_w)
    weight_scale_bits: int = 40
    #: flooding noise in threshold decryption: uniform on [−2^k, 2^k] per coefficient. The decryption
    #: noise of a weighted sum is about 2^48 here (measured, docs/HE.md), so 2^68 floods it by 2^20
    #: and costs about 2e-6 of absolute precision.
    smudge_bits: int = 68

    def __post_init__(self) -> None:
        if self.poly_degree not in (4096, 8192, 16384, 32768):
            raise HeError(f"poly_degree must be a power of two in 4096..32768, not {self.poly_degree}")
        if not 0 < self.smudge_bits <= 100:
            raise HeError("smudge_bits must be in 1..100")

    @property
    def slots(self) -> int:
        return self.poly_degree // 2


def _u64(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype="<u8").tobytes()


def _sealed(payload: bytes) -> bytes:
    """SEAL's serialisation header (magic 0xA15E, 16 bytes, version 4.3, no compression) + payload."""
    return struct.pack("<HBBBBHQ", 0xA15E, 16, 4, 3, 0, 0, 16 + len(payload)) + payload


def _dyn_array(data: np.ndarray) -> bytes:
    flat = np.ascontiguousarray(data, dtype="<u8").ravel()
    return _sealed(struct.pack("<Q", flat.size) + flat.tobytes())


class CkksContext:
    """A SEAL CKKS context with the helpers every party shares: the common random polynomial, reads and
    writes of NTT-form polynomials, (de)serialisation of ciphertexts."""

    def __init__(
        self, params: ThresholdParams | None = None, crs_seed: bytes = b"ldp-telemetry threshold ckks"
    ) -> None:
        s = _seal()
        self.params = params or ThresholdParams()
        self.crs_seed = crs_seed
        parms = s.EncryptionParameters(s.SCHEME_TYPE.CKKS)
        parms.set_poly_modulus_degree(self.params.poly_degree)
        parms.set_coeff_modulus(s.CoeffModulus.Create(self.params.poly_degree, list(self.params.coeff_bits)))
        self.seal = s.SEALContext(parms, True, s.SEC_LEVEL_TYPE.TC128)
        if not self.seal.parameters_set():
            raise HeError(f"SEAL refused the parameters: {self.seal.parameters_error_message()}")
        self.encoder = s.CKKSEncoder(self.seal)
        self.evaluator = s.Evaluator(self.seal)
        self.moduli = [m.value() for m in self.seal.key_context_data().parms().coeff_modulus()]
        self._modulus_objects = list(self.seal.key_context_data().parms().coeff_modulus())
        self._ntt = [s.util.NTTTables(int(math.log2(self.params.poly_degree)), m) for m in self._modulus_objects]
        self.scale = float(2**self.params.scale_bits)
        self._tmp = tempfile.TemporaryDirectory(prefix="ldp-he-")

    # ---------------------------------------------------------------- polynomials
    @property
    def n(self) -> int:
        return self.params.poly_degree

    def common_random_poly(self, label: bytes = b"") -> np.ndarray:
        """a, uniform mod each prime (in NTT form, where uniform is uniform), expanded from the public seed
        (and ``label``, for the other common polynomials: those of the relinearisation key)."""
        rows = []
        for j, q in enumerate(self.moduli):
            need, out = self.n, []
            counter = 0
            mask = (1 << q.bit_length()) - 1
            while need > 0:
                raw = hashlib.shake_256(self.crs_seed + label + struct.pack("<II", j, counter)).digest(8 * 2 * self.n)
                cand = np.frombuffer(raw, dtype="<u8") & np.uint64(mask)
                ok = cand[cand < np.uint64(q)][:need]  # rejection sampling: exactly uniform below q
                out.append(ok)
                need -= ok.size
                counter += 1
            rows.append(np.concatenate(out))
        return np.stack(rows)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Pointwise product mod each prime of two (limbs, N) NTT-form polynomials."""
        out = np.empty_like(a)
        for j in range(a.shape[0]):
            q = self.moduli[j]
            out[j] = ((a[j].astype(object) * b[j].astype(object)) % q).astype(np.uint64)
        return out

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        for j in range(a.shape[0]):
            q = self.moduli[j]
            out[j] = ((a[j].astype(object) + b[j].astype(object)) % q).astype(np.uint64)
        return out

    def neg(self, a: np.ndarray) -> np.ndarray:
        out = np.empty_like(a)
        for j in range(a.shape[0]):
            q = np.uint64(self.moduli[j])
            out[j] = np.where(a[j] == 0, np.uint64(0), q - a[j])
        return out

    def small_to_ntt(self, coeffs: Sequence[int], limbs: int) -> np.ndarray:
        """NTT form over the first ``limbs`` primes of a polynomial with small signed coefficients."""
        rows = []
        for j in range(limbs):
            q = self.moduli[j]
            lifted = [int(c) % q for c in coeffs]
            rows.append(np.asarray(self._seal_util().ntt_negacyclic_harvey(lifted, self._ntt[j]), dtype=np.uint64))
        return np.stack(rows)

    @staticmethod
    def _seal_util() -> Any:
        return _seal().util

    # ---------------------------------------------------------------- SEAL objects
    def read_plaintext(self, pt: Any) -> np.ndarray:
        count = pt.coeff_count()
        return np.fromiter((pt[i] for i in range(count)), dtype=np.uint64, count=count).reshape(-1, self.n)

    def read_ciphertext(self, ct: Any, polys: Sequence[int] | None = None) -> np.ndarray:
        """(size, limbs, N) array of an NTT-form ciphertext's polynomials (only ``polys`` if given)."""
        limbs = ct.coeff_modulus_size()
        width = limbs * self.n
        which = range(ct.size()) if polys is None else polys
        rows = [np.fromiter((ct[i] for i in range(k * width, (k + 1) * width)), np.uint64, width) for k in which]
        return np.stack(rows).reshape(len(rows), limbs, self.n)

    def _path(self, name: str) -> str:
        return os.path.join(self._tmp.name, name)

    def _load(self, obj: Any, blob: bytes) -> Any:
        path = self._path(f"{type(obj).__name__}-{os.getpid()}-{id(obj)}")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            obj.load(self.seal, path)
        except (RuntimeError, ValueError) as e:
            raise HeError(f"SEAL refused the {type(obj).__name__}: {e}") from e
        finally:
            os.unlink(path)
        return obj

    def load_plaintext(self, parms_id: Sequence[int], data: np.ndarray, scale: float) -> Any:
        payload = _u64(parms_id) + struct.pack("<Qd", data.size, scale) + _dyn_array(data)
        return self._load(_seal().Plaintext(), _sealed(payload))

    @staticmethod
    def _ciphertext_blob(parms_id: Sequence[int], polys: np.ndarray, scale: float) -> bytes:
        size, limbs, n = polys.shape
        head = struct.pack("<BQQQdQ", 1, size, n, limbs, scale, 1)  # NTT form, size, N, primes, scale, correction
        return _sealed(_u64(parms_id) + head + _dyn_array(polys.reshape(-1)))

    def load_ciphertext(self, parms_id: Sequence[int], polys: np.ndarray, scale: float) -> Any:
        return self._load(_seal().Ciphertext(), self._ciphertext_blob(parms_id, polys, scale))

    def public_key(self, b: np.ndarray, a: np.ndarray) -> Any:
        """A SEAL public key (b, a) at the key level (a public key serialises as its ciphertext)."""
        blob = self._ciphertext_blob(self.seal.key_parms_id(), np.stack([b, a]), 1.0)
        return self._load(_seal().PublicKey(), blob)

    def serialize(self, ct: Any) -> bytes:
        """A ciphertext as SEAL serialises it (zstd-compressed): what travels between parties."""
        path = self._path(f"ct-{os.getpid()}-{id(ct)}")
        ct.save(path)
        try:
            with open(path, "rb") as f:
                return f.read()
        finally:
            os.unlink(path)

    def deserialize(self, blob: bytes) -> Any:
        return self._load(_seal().Ciphertext(), blob)

    # ---------------------------------------------------------------- encoding
    def encrypt(self, public_key: Any, values: Sequence[float] | np.ndarray) -> list[Any]:
        """Encrypt a vector as ⌈len / slots⌉ ciphertexts under ``public_key`` (SEAL's own encryption)."""
        s = _seal()
        enc = s.Encryptor(self.seal, public_key)
        x = np.asarray(values, dtype=np.float64).ravel()
        out = []
        for start in range(0, max(x.size, 1), self.params.slots):
            pt = s.Plaintext()
            self.encoder.encode(x[start : start + self.params.slots].tolist(), self.scale, pt)
            ct = s.Ciphertext()
            enc.encrypt(pt, ct)
            out.append(ct)
        return out

    def multiply_scalar(self, ct: Any, w: float) -> Any:
        """ct · w with w encoded at the context's scale (the result's scale is the product; no rescale)."""
        s = _seal()
        pt = s.Plaintext()
        self.encoder.encode(float(w), ct.parms_id(), float(2**self.params.weight_scale_bits), pt)
        out = s.Ciphertext()
        self.evaluator.multiply_plain(ct, pt, out)
        return out

    def add_many(self, cts: Sequence[Any]) -> Any:
        s = _seal()
        out = s.Ciphertext()
        self.evaluator.add_many(list(cts), out)
        return out


def _smudge(n: int, bits: int, random_bytes: RandomBytes) -> list[int]:
    """n integers uniform on [−2^bits, 2^bits − 1] from the CSPRNG (masking to a power of two: no bias)."""
    words = np.frombuffer(random_bytes(16 * n), dtype="<u8").reshape(n, 2).astype(object)
    mask, offset = (1 << (bits + 1)) - 1, 1 << bits
    return list((((words[:, 1] << 64) | words[:, 0]) & mask) - offset)


class KeyParty:
    """One holder of a secret-key share: it publishes its public-key share and answers partial
    decryptions. Its share s_i never leaves the object."""

    def __init__(self, ctx: CkksContext, random_bytes: RandomBytes = os.urandom) -> None:
        s = _seal()
        self.ctx = ctx
        self._random_bytes = random_bytes
        keygen = s.KeyGenerator(ctx.seal)
        secret = keygen.secret_key()
        plain = secret.data()  # both kept alive while read: SEAL returns references
        self._s = ctx.read_plaintext(plain)  # (limbs at key level, N), NTT form
        own = s.PublicKey()
        keygen.create_public_key(own)
        own_ct = own.data()
        p = ctx.read_ciphertext(own_ct)  # (−a'·s_i + e_i, a'), never published: gives e_i in NTT form
        self._e = ctx.add(p[0], ctx.mul(p[1], self._s))

    def public_share(self) -> np.ndarray:
        """b_i = −a·s_i + e_i, for the common a."""
        a = self.ctx.common_random_poly()
        return self.ctx.add(self.ctx.neg(self.ctx.mul(a, self._s)), self._e)

    def _check_decryptable(self, ct: Any) -> None:
        if not ct.is_ntt_form() or ct.size() != 2:
            raise HeError("partial decryption takes a size-2, NTT-form ciphertext (relinearise products first)")
        if ct.scale < 2.0 ** (self.ctx.params.smudge_bits + 20):
            # the flooding noise would swamp the message: only weighted sums (scale Δ·Δ_w) are decrypted
            raise HeError(
                f"ciphertext scale 2^{math.log2(ct.scale):.0f} is too small for flooding noise of 2^"
                f"{self.ctx.params.smudge_bits}: decrypt a weighted sum (multiply_scalar), scale 2^"
                f"{self.ctx.params.scale_bits + self.ctx.params.weight_scale_bits}"
            )

    def partial_decrypt(self, ct: Any) -> np.ndarray:
        """d_i = c1·s_i + E_i over the ciphertext's primes, E_i flooding noise (fresh, CSPRNG)."""
        self._check_decryptable(ct)
        c1 = self.ctx.read_ciphertext(ct, polys=[1])[0]  # c0 is not needed
        limbs = c1.shape[0]
        noise = self.ctx.small_to_ntt(_smudge(self.ctx.n, self.ctx.params.smudge_bits, self._random_bytes), limbs)
        return self.ctx.add(self.ctx.mul(c1, self._s[:limbs]), noise)


def collective_public_key(ctx: CkksContext, shares: Sequence[np.ndarray]) -> Any:
    """The SEAL public key (Σ b_i, a) from every party's share."""
    if not shares:
        raise HeError("no public-key shares")
    b = shares[0]
    for sh in shares[1:]:
        b = ctx.add(b, sh)
    return ctx.public_key(b, ctx.common_random_poly())


def combine(
    ctx: CkksContext, ct: Any, partials: Mapping[Any, np.ndarray], parties: Sequence[Any], length: int | None = None
) -> np.ndarray:
    """c0 + Σ d_i, decoded: the plaintext vector. Refuses unless every party in ``parties`` answered."""
    missing = [p for p in parties if p not in partials]
    if missing:
        raise MissingShareError(f"threshold decryption needs every key party's share; missing {missing}")
    return decode_sum(ctx, ct, [partials[p] for p in parties], length)


def decode_sum(ctx: CkksContext, ct: Any, partials: Sequence[np.ndarray], length: int | None = None) -> np.ndarray:
    """c0 + Σ partials, decoded, with no completeness check (what a party holding fewer shares gets)."""
    polys = ctx.read_ciphertext(ct)
    acc = polys[0]
    for d in partials:
        if d.shape != acc.shape:
            raise HeError(f"partial decryption of shape {d.shape} for a ciphertext of shape {acc.shape}")
        acc = ctx.add(acc, d)
    pt = ctx.load_plaintext(ct.parms_id(), acc, ct.scale)
    out = np.asarray(ctx.encoder.decode_double(pt), dtype=np.float64)
    return out if length is None else out[:length]
