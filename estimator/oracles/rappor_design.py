r"""RAPPOR's least-squares decoding design, built fast and cached on disk.

:class:`ldp_core.mechanisms.rappor.RapporDesign` defines the decoding
(n̂ = m G⁻¹ Xᵀ t, G = XᵀX) and its exact variance
(Var n̂ = m H n + m α n diag(G⁻¹) + m β K n - n), and builds it with numpy
alone, as the device package must. The server builds the same matrices here:

* X_c as a sparse (k × d) matrix with h·d ones, so the products X_c M and
  X_cᵀ R of the variance cost O(h·d²) per cohort instead of fancy-indexed
  copies and ``np.add.at``;
* G = L Lᵀ factored once (the same LAPACK Cholesky as the reference); the
  counts solve with L (two triangular solves, ``cho_solve``) and no inverse
  is stored. H and K need every entry of G⁻¹ (A = G⁻¹Xᵀ is dense, m·k·d
  entries), and forming A by solving against Xᵀ would cost 2·m·k·d² ≥ 16 d³
  flops, so G⁻¹ is computed once, temporarily, from the factor (LAPACK
  ``potri``, d³/3 + d³/3 flops, instead of an LU inverse of G from scratch).

The arrays (L, H, K, diag(G⁻¹)) are cached per (spec, candidate set): in
process in a small LRU, and on disk in :func:`cache_dir` (``$LDP_CACHE_DIR``,
else ``$XDG_CACHE_HOME/ldp-telemetry``, else ``~/.cache/ldp-telemetry``), one
``.npz`` file per key named after the format version, the ``spec_id`` and a
digest of the candidates. Files are written with
:func:`ldp_core.files.write_atomic` (a temporary file in the same directory,
fsynced and renamed over the target), so a reader sees a whole file or none,
whatever the number of writers. A file is
used only if it loads without pickles, names this format, spec (its full
canonical form, not only the id) and candidates, has the expected shapes and
dtypes, and its SHA-256 over the metadata and the array bytes matches;
otherwise it is ignored, rebuilt and overwritten. A cache directory that
cannot be written is skipped (the design is still built and returned).

The folder is bounded: after each write, the least recently used design files
(by modification time; a load touches its file) are deleted until the
folder holds at most :func:`cache_limit` bytes (``$LDP_CACHE_MAX_BYTES``,
default 1 GiB; a design at d = 1024 is 24 MiB, at the largest domain 4,096
about 400 MiB). A design larger than the whole budget is not written.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import threading
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse

from ldp_core.files import write_atomic
from ldp_core.mechanisms.rappor import RapporDesign, RapporSpec, check_gram_factor, design_positions

__all__ = [
    "FORMAT_VERSION",
    "DesignArrays",
    "build_design_arrays",
    "cache_dir",
    "cache_path",
    "clear_memory_cache",
    "load_design_arrays",
    "rappor_design",
    "store_design_arrays",
]

log = logging.getLogger(__name__)

#: Bump when the stored arrays or their meaning change.
FORMAT_VERSION = 1
#: Designs kept in memory per process (each holds three d × d float64 matrices).
MEMORY_ENTRIES = 8
_ARRAYS = ("chol", "h_matrix", "k_matrix", "gram_inv_diag", "candidates")


@dataclasses.dataclass(frozen=True)
class DesignArrays:
    """What decoding needs beyond the Bloom positions: the lower Cholesky factor
    ``chol`` of G, H, K, diag(G⁻¹), over ``candidates`` (see the module docstring)."""

    candidates: np.ndarray
    chol: np.ndarray
    h_matrix: np.ndarray
    k_matrix: np.ndarray
    gram_inv_diag: np.ndarray

    def design(self, spec: RapporSpec) -> RapporDesign:
        """The :class:`RapporDesign` of ``spec`` that solves with ``chol``."""
        solve = partial(scipy.linalg.cho_solve, (self.chol, True), check_finite=False)
        return RapporDesign.from_matrices(
            spec,
            self.candidates,
            h_matrix=self.h_matrix,
            k_matrix=self.k_matrix,
            gram_inv_diag=self.gram_inv_diag,
            gram_solve=solve,
        )


def _cohort_operators(spec: RapporSpec, positions: np.ndarray, valid: np.ndarray) -> list[scipy.sparse.csr_matrix]:
    """X_c for every cohort: (k × d) CSR with a one at (bit, candidate) for each distinct filter bit."""
    m, d, h = positions.shape
    cols = np.broadcast_to(np.arange(d)[:, None], (d, h))
    out = []
    for c in range(m):
        sel = valid[c]
        ones = np.ones(int(sel.sum()))
        out.append(scipy.sparse.csr_matrix((ones, (positions[c][sel], cols[sel])), shape=(spec.num_bits, d)))
    return out


def build_design_arrays(spec: RapporSpec, candidates: Any = None) -> DesignArrays:
    """Build the design over ``candidates`` (default: the whole domain) without the
    disk cache: G = Σ_c X_cᵀX_c, L = chol(G) (rank-deficient designs raise
    :class:`SpecError` as in the reference), G⁻¹ from L, then with A_cᵀ = X_c G⁻¹:
    H = Σ_c (X_cᵀ A_cᵀ)ᵀ∘², K = Σ_c (X_cᵀ (A_cᵀ)∘²)ᵀ."""
    cand = np.arange(spec.domain_size, dtype=np.int64) if candidates is None else candidates
    cand, positions, valid = design_positions(spec, cand)
    d = cand.size
    xs = _cohort_operators(spec, positions, valid)
    stacked = scipy.sparse.vstack(xs, format="csr")
    gram = (stacked.T @ stacked).toarray()
    chol = check_gram_factor(gram, np.linalg.cholesky, d)
    lower, info = scipy.linalg.lapack.dpotri(chol, lower=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"dpotri failed with info={info}")
    lower = np.tril(lower)
    gram_inv = lower + lower.T
    gram_inv[np.diag_indices(d)] = np.diag(lower)
    del lower
    h_t = np.zeros((d, d))
    k_t = np.zeros((d, d))
    for x in xs:
        a_ct = x @ gram_inv
        p_c = x.T @ a_ct
        h_t += p_c * p_c
        a_ct *= a_ct
        k_t += x.T @ a_ct
    return DesignArrays(
        candidates=cand,
        chol=np.ascontiguousarray(chol),
        h_matrix=np.ascontiguousarray(h_t.T),
        k_matrix=np.ascontiguousarray(k_t.T),
        gram_inv_diag=np.diag(gram_inv).copy(),
    )


# -- disk cache ---------------------------------------------------------------------


def cache_dir() -> Path:
    """``$LDP_CACHE_DIR``, else ``$XDG_CACHE_HOME/ldp-telemetry``, else ``~/.cache/ldp-telemetry``."""
    explicit = os.environ.get("LDP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ldp-telemetry"


#: default bound on the design files kept on disk (bytes)
DEFAULT_CACHE_LIMIT = 1 << 30


def cache_limit() -> int:
    """``$LDP_CACHE_MAX_BYTES`` (a non-negative integer; 0 keeps nothing on disk), else 1 GiB."""
    raw = os.environ.get("LDP_CACHE_MAX_BYTES")
    if raw is None or raw.strip() == "":
        return DEFAULT_CACHE_LIMIT
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"LDP_CACHE_MAX_BYTES must be a non-negative integer (bytes), got {raw!r}")
    return value


def _evict(folder: Path, limit: int, keep: Path | None = None) -> int:
    """Delete the least recently used design files of ``folder`` until their total is at most ``limit``
    (``keep``, the file just written, goes last); return how many were deleted."""
    files = []
    for f in folder.glob("design-v*.npz"):
        try:
            st = f.stat()
        except OSError:  # removed by another process meanwhile
            continue
        files.append((f == keep, st.st_mtime, st.st_size, f))
    files.sort(key=lambda t: (t[0], t[1]))
    total = sum(t[2] for t in files)
    removed = 0
    for _, _, size, f in files:
        if total <= limit:
            break
        try:
            f.unlink()
            removed += 1
        except OSError:
            pass
        total -= size
    return removed


def _candidates_digest(cand: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(cand, dtype="<i8").tobytes()).hexdigest()


def cache_path(spec: RapporSpec, candidates: np.ndarray) -> Path:
    """The file that holds (or would hold) the design of ``spec`` over ``candidates``."""
    digest = _candidates_digest(candidates)[:16]
    return cache_dir() / "rappor" / f"design-v{FORMAT_VERSION}-{spec.spec_id}-{digest}.npz"


def _meta(spec: RapporSpec, cand: np.ndarray) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "spec_id": spec.spec_id,
        "spec": spec.to_dict(),
        "candidates_sha256": _candidates_digest(cand),
    }


def _checksum(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())
    for name in _ARRAYS:
        arr = arrays[name]
        h.update(f"{name}:{arr.dtype.str}:{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def store_design_arrays(spec: RapporSpec, arrays: DesignArrays) -> Path | None:
    """Write ``arrays`` to :func:`cache_path` atomically; the path, or None when the
    cache directory cannot be written (logged, not raised)."""
    path = cache_path(spec, arrays.candidates)
    fields = {name: getattr(arrays, name) for name in _ARRAYS}
    limit = cache_limit()
    if sum(a.nbytes for a in fields.values()) > limit:
        log.info("rappor design cache: %s would exceed LDP_CACHE_MAX_BYTES=%d; not written", path.name, limit)
        return None
    meta = _meta(spec, arrays.candidates)
    meta["sha256"] = _checksum({k: v for k, v in meta.items()}, fields)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda fh: np.savez(fh, meta=np.array(json.dumps(meta, sort_keys=True)), **fields))
        _evict(path.parent, limit, keep=path)
    except OSError as exc:
        log.warning("rappor design cache: cannot write %s (%s); continuing without it", path, exc)
        return None
    return path


def load_design_arrays(spec: RapporSpec, candidates: np.ndarray) -> DesignArrays | None:
    """The cached design of ``spec`` over ``candidates`` if its file exists and passes
    every check of the module docstring; None otherwise (a bad file is logged)."""
    cand = np.asarray(candidates, dtype=np.int64)
    path = cache_path(spec, cand)
    if not path.is_file():
        return None
    d = cand.size
    shapes = {"chol": (d, d), "h_matrix": (d, d), "k_matrix": (d, d), "gram_inv_diag": (d,), "candidates": (d,)}
    try:
        with np.load(path, allow_pickle=False) as npz:
            if set(npz.files) != {"meta", *_ARRAYS}:
                raise ValueError(f"unexpected members {sorted(npz.files)}")
            meta = json.loads(str(npz["meta"][()]))
            fields = {name: npz[name] for name in _ARRAYS}
        stored_sum = meta.pop("sha256", None)
        if meta != _meta(spec, cand):
            raise ValueError("format, spec or candidates differ")
        for name, shape in shapes.items():
            want = np.int64 if name == "candidates" else np.float64
            if fields[name].shape != shape or fields[name].dtype != want:
                raise ValueError(f"{name} has shape {fields[name].shape} and dtype {fields[name].dtype}")
        if not np.array_equal(fields["candidates"], cand):
            raise ValueError("candidates differ")
        if stored_sum != _checksum(meta, fields):
            raise ValueError("checksum mismatch")
    except Exception as exc:  # any unreadable or inconsistent file is rebuilt, never trusted
        log.warning("rappor design cache: ignoring %s (%s: %s)", path, type(exc).__name__, exc)
        return None
    try:
        os.utime(path)  # recently used: evicted last
    except OSError:
        pass
    return DesignArrays(**fields)


# -- in-process LRU and the entry point --------------------------------------------

_memory: collections.OrderedDict[tuple[str, str], tuple[RapporSpec, RapporDesign]] = collections.OrderedDict()
_memory_lock = threading.Lock()


def clear_memory_cache() -> None:
    """Forget every design held in this process (the disk cache stays)."""
    with _memory_lock:
        _memory.clear()


def rappor_design(spec: RapporSpec, candidates: Any = None, *, use_disk: bool = True) -> RapporDesign:
    """The decoding design of ``spec`` over ``candidates`` (default: the whole domain):
    from the in-process LRU, else the disk cache, else built
    (:func:`build_design_arrays`) and stored. A whole-domain design is also handed
    to the spec (:meth:`RapporSpec.adopt_full_design`) so ``count_variance`` reuses it."""
    whole = candidates is None
    cand = np.arange(spec.domain_size, dtype=np.int64) if whole else np.asarray(candidates)
    if cand.ndim == 1 and cand.dtype.kind in "iu":
        cand = cand.astype(np.int64)
    key = (spec.spec_id, _candidates_digest(cand) if cand.dtype == np.int64 else "")
    with _memory_lock:
        hit = _memory.get(key)
        if hit is not None and hit[0] == spec:
            _memory.move_to_end(key)
            design = hit[1]
        else:
            design = None
    if design is None:
        arrays = load_design_arrays(spec, cand) if use_disk and key[1] else None
        if arrays is None:
            arrays = build_design_arrays(spec, cand)
            if use_disk:
                store_design_arrays(spec, arrays)
        design = arrays.design(spec)
        with _memory_lock:
            _memory[key] = (spec, design)
            _memory.move_to_end(key)
            while len(_memory) > MEMORY_ENTRIES:
                _memory.popitem(last=False)
    if whole:
        spec.adopt_full_design(design)
    return design
