r"""Heavy-hitter discovery over strings, server side: PEM and SFP decoding.

The device side, with both protocols, is :mod:`ldp_core.mechanisms.heavy_hitters`.

**PEM** (:func:`discover_pem`). Level 0 ranks all 2^s prefixes of s bits;
every later level extends each of the c kept candidates by the level's new
bits and ranks the extensions; the last level's candidates are whole values.
A level's n_j reports estimate each candidate's holders among the level's
devices with OLH's exact support counts C_x (:func:`olh_candidate_support`,
one XXH32 per report and candidate):

    n̂_{j,x} = (C_x - n_j q*) / (p* - q*),   p* = e^ε/(e^ε + g - 1), q* = 1/g,

and the population count by the level's share, n̂_x = (n / n_j) n̂_{j,x}.
Given n_j, a level's devices are a uniform random n_j-subset of the n
(levels are uniform and independent of values), so n_{j,x} is
hypergeometric with mean n_j f_x (f_x = n_x / n): n̂_x is unbiased, with

    Var n̂_x = (n/n_j)² [ (μ p*(1-p*) + (n_j - μ) q*(1-q*)) / (p* - q*)²
                         + n_j f_x (1 - f_x) (n - n_j)/(n - 1) ],   μ = n_j f_x

(the OLH variance of Wang et al. 2017, Sec. 3, averaged over the subset,
plus the hypergeometric variance of the subset's count). Reported
variances plug in the estimate clipped to [0, n]; intervals are normal.
Which candidates a level keeps, and the final order, come from their posterior probability over the
whole chain of level estimates (:mod:`estimator.mechanisms.pem_posterior`; ``ranking="estimate"``
ranks each level by its own estimate, as before).

**SFP** (:func:`discover_sfp`). For each fragment position l the fragment
sketch of the reports at l estimates every key ``r << 16 | fragment``
(2^(16 + hash_bits) of them); the top ``fragments`` keys per position
survive. Words are assembled per tag r from one surviving fragment per
position, and *every* assembled word is estimated with the whole-word
sketch, which decides the ranking (a word whose fragments were all heavy but
which nobody typed scores about zero there). Both sketches are debiased
with the ε they were encoded with (``SFPSpec.fragment_spec`` and
``word_spec``). Counts from a position's sketch are scaled by n / n_l. A word's
estimate loses what the significant candidates put in its cells
(:func:`without_heavy_collisions`), and its variance is the sketch's at n devices
in all (:func:`tail_counts`), so an untyped word's z is about N(0, 1).
"""

from __future__ import annotations

import codecs
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.errors import BatchError
from estimator.kernels.candidates import olh_candidate_support, sketch_row_means
from estimator.kernels.hadamard import fwht
from estimator.kernels.sketch import cms_add, hcms_add
from estimator.mechanisms.pem_posterior import PosteriorChains
from estimator.oracles.base import LinearState
from estimator.result import noise_test, norm_sub, z_value
from ldp_core.mechanisms.cms import CMSSpec, HCMSSpec
from ldp_core.mechanisms.heavy_hitters import PEMSpec, SFPSpec, prefix_keys, reserved_byte_mask, unpad

__all__ = [
    "HeavyHitter",
    "Discovery",
    "discover",
    "discover_pem",
    "discover_sfp",
    "discover_pem_from",
    "discover_sfp_from",
    "sketch_sums",
    "add_sketch",
    "pem_count_variance",
    "tail_counts",
    "without_heavy_collisions",
    "pem_level_estimate",
    "pem_level_support",
    "possible_prefixes",
    "alphabet_prefixes",
    "enumerate_alphabet_prefixes",
    "enumerate_prefixes",
    "extend_prefixes",
    "extend_prefixes_pruned",
    "PEM_RANKINGS",
    "check_ranking",
    "StreamingSummary",
    "HeavyHitterStreamState",
]


@dataclasses.dataclass(frozen=True)
class HeavyHitter:
    """One discovered value: its padded bytes, count estimate, variance and interval."""

    raw: bytes
    estimate: float
    variance: float
    ci_low: float
    ci_high: float

    @property
    def value(self) -> str:
        return unpad(self.raw)

    def to_row(self) -> list[Any]:
        """``[value, estimate, ci_low, ci_high]`` (the simulate contract's ``found`` entry)."""
        return [self.value, self.estimate, self.ci_low, self.ci_high]


@dataclasses.dataclass(frozen=True)
class Discovery:
    """What a discovery run found, best first, and how it got there."""

    mechanism: str
    n: int
    found: list[HeavyHitter]
    candidates: list[int]  # candidates ranked per level (PEM), or words assembled and words ranked (SFP)
    seconds: float

    def top(self, k: int) -> list[HeavyHitter]:
        return self.found[:k]

    @property
    def tested(self) -> int:
        """How many whole values were ranked at the end: the m of the Bonferroni rule (:meth:`noise`)."""
        return max(1, int(self.candidates[-1])) if self.candidates else 1

    def noise(self, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """``(adjusted_ci_low, could_be_noise)`` of every found value, Bonferroni over the :attr:`tested`
        values (:func:`estimator.result.noise_test`). The last level's (PEM) or the word sketch's (SFP)
        reports chose none of the candidates (PEM's earlier levels are other devices; SFP's fragment
        reports are independent randomizations), so each test is valid given the candidate list."""
        est = np.array([h.estimate for h in self.found], dtype=np.float64)
        se = np.sqrt(np.maximum([h.variance for h in self.found], 0.0)) if self.found else np.zeros(0)
        return noise_test(est, se, self.tested, confidence)


def enumerate_prefixes(bits: int, length: int) -> np.ndarray:
    """All 2^bits prefixes of ``bits`` bits, as ``(2^bits, length)`` padded rows (rest zero)."""
    nbytes = -(-bits // 8)
    vals = np.arange(2**bits, dtype=np.uint64) << np.uint64(8 * nbytes - bits)
    out = np.zeros((2**bits, length), dtype=np.uint8)
    for i in range(nbytes):
        out[:, i] = ((vals >> np.uint64(8 * (nbytes - 1 - i))) & np.uint64(0xFF)).astype(np.uint8)
    return out


def extend_prefixes(rows: np.ndarray, bits: int, new_bits: int) -> np.ndarray:
    """Every extension of each ``bits``-bit prefix in ``rows`` to ``new_bits`` bits (rows × 2^(new - old))."""
    step = new_bits - bits
    bitmat = np.unpackbits(rows, axis=1)
    ext = np.repeat(bitmat, 2**step, axis=0)
    tails = ((np.arange(2**step)[:, None] >> np.arange(step - 1, -1, -1)[None, :]) & 1).astype(np.uint8)
    ext[:, bits:new_bits] = np.tile(tails, (rows.shape[0], 1))
    return np.packbits(ext, axis=1)


_RESERVED = reserved_byte_mask()

#: how PEM ranks and prunes candidates (:func:`discover_pem`)
PEM_RANKINGS = ("posterior", "estimate")
#: the posterior ranking's beam: FIRST_BEAM·c candidates kept at level 0, LATER_BEAM·c after (seeds 4-9),
#: for at most WIDE_BEAM_MAX_REPORTS reports; above, c at every level: at n = 10^6 the wide beam found the
#: same words at about twice the decode time (docs/HEAVY_HITTERS.md, *Ranking by posterior*)
FIRST_BEAM, LATER_BEAM = 4, 2
WIDE_BEAM_MAX_REPORTS = 300_000


def posterior_beam(n: int) -> tuple[int, int]:
    """The posterior ranking's beam widths (at level 0, after it), as multiples of ``keep``, for ``n`` reports."""
    return (FIRST_BEAM, LATER_BEAM) if n <= WIDE_BEAM_MAX_REPORTS else (1, 1)


def possible_prefixes(rows: np.ndarray, bits: int, final: bool = False, end_marker: int = 0) -> np.ndarray:
    """Whether each candidate can be the ``bits``-bit prefix of a padded value at all (a bool mask).

    A padded value is non-empty UTF-8 without NUL, then 0x00 padding: its first
    byte is not 0, and no non-zero bit follows a 0x00 byte. A ``final``
    candidate must also decode as UTF-8. Pruning the impossible ones frees
    their places for candidates that can be real (and keeps noise such as
    ``"news\x00\x00\x02"`` out of the answer).

    Under ``end_marker`` 1 values hold no control character (0x01..0x1F, 0x7F), so also: no complete
    byte is one, a partial last byte must begin some byte a value can hold there, and the bytes before
    the padding must be a prefix of valid UTF-8 (docs/HEAVY_HITTERS.md, *The end of a value*)."""
    full, rest = divmod(bits, 8)
    ok = np.ones(rows.shape[0], dtype=bool)
    if full:
        zero = rows[:, :full] == 0
        seen = np.maximum.accumulate(zero, axis=1)
        ok &= ~zero[:, 0] & ~(seen & ~zero).any(axis=1)
        if rest:
            ok &= ~(seen[:, -1] & ((rows[:, full] & np.uint8((0xFF << (8 - rest)) & 0xFF)) != 0))
    if end_marker:
        ok &= ~_RESERVED[rows[:, :full]].any(axis=1)
        cache: dict[tuple[bytes, int], bool] = {}
        for i in np.nonzero(ok)[0]:
            ok[i] = _text_prefix_ok(
                bytes(rows[i, :full]), int(rows[i, full]) >> (8 - rest) if rest else -1, rest, cache
            )
    if final:
        for i in np.nonzero(ok)[0]:
            try:
                bytes(rows[i]).rstrip(b"\x00").decode("utf-8")
            except UnicodeDecodeError:
                ok[i] = False
    return ok


def alphabet_prefixes(rows: np.ndarray, bits: int, alphabet: bytes) -> np.ndarray:
    """Whether each ``bits``-bit candidate can begin a padded value whose bytes all come from ``alphabet``
    (a bool mask): every complete byte is in it or is 0x00 padding (and none follows the padding, as
    :func:`possible_prefixes` checks), and a partial last byte's top bits begin an alphabet byte or 0x00.

    A prior the server states, as pure-ldp's PEM takes its alphabet: a value with any other byte can no
    longer be found, and each kept prefix extends to |alphabet|^(η/8) candidates instead of 2^η, so far
    fewer noise candidates compete for the kept places (docs/HEAVY_HITTERS.md, *A known alphabet*)."""
    allowed = np.zeros(256, dtype=bool)
    allowed[np.frombuffer(bytes(alphabet), dtype=np.uint8)] = True
    allowed[0] = True
    full, rest = divmod(bits, 8)
    ok = allowed[rows[:, :full]].all(axis=1)
    if rest:
        tops = np.zeros(1 << rest, dtype=bool)
        tops[np.nonzero(allowed)[0] >> (8 - rest)] = True
        ok &= tops[rows[:, full] >> (8 - rest)]
    return ok


def enumerate_alphabet_prefixes(bits: int, length: int, alphabet: bytes) -> np.ndarray:
    """The ``bits``-bit prefixes :func:`alphabet_prefixes` keeps (over ``alphabet`` and the 0x00 padding),
    built byte by byte: (|alphabet| + 1)^(bits/8) rows instead of all 2^bits."""
    symbols = np.unique(np.frombuffer(bytes(alphabet) + b"\x00", dtype=np.uint8))
    full, rest = divmod(bits, 8)
    out = np.zeros((1, length), dtype=np.uint8)
    for i in range(full):
        out = np.repeat(out, symbols.size, axis=0)
        out[:, i] = np.tile(symbols, out.shape[0] // symbols.size)
    if rest:
        tops = np.unique(symbols >> (8 - rest)).astype(np.uint8) << (8 - rest)
        out = np.repeat(out, tops.size, axis=0)
        out[:, full] = np.tile(tops, out.shape[0] // tops.size)
    return out


def _text_prefix_ok(data: bytes, partial: int, rest: int, cache: dict[tuple[bytes, int], bool]) -> bool:
    """Whether ``data`` (complete bytes) followed by the ``rest`` top bits ``partial`` of one more byte
    can begin a padded ``end_marker`` 1 value: UTF-8 without control characters, then 0x00s."""
    value = data.split(b"\x00", 1)[0]
    ended = len(value) < len(data)
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        decoder.decode(value, final=ended)
    except UnicodeDecodeError:
        return False
    if ended or rest == 0:
        return True
    pending = decoder.getstate()[0]  # the bytes of an unfinished character (at most 3)
    key = (pending, (rest << 8) | partial)
    hit = cache.get(key)
    if hit is None:
        low = partial << (8 - rest)
        hit = False
        for b in range(low, low + (1 << (8 - rest))):
            if b == 0:
                hit = not pending  # the padding begins: the value must have ended on a whole character
            elif not _RESERVED[b]:
                try:
                    codecs.getincrementaldecoder("utf-8")().decode(pending + bytes([b]), final=False)
                    hit = True
                except UnicodeDecodeError:
                    continue
            if hit:
                break
        cache[key] = hit
    return hit


def pem_count_variance(spec: PEMSpec, counts: np.ndarray, n: int, n_level: int) -> np.ndarray:
    """Variance of PEM's population count estimate from a level of ``n_level`` of ``n`` devices
    (module docstring), at true counts ``counts``.

    Under ``oracle="hcms"`` the oracle's part is :meth:`HCMSSpec.count_variance` at the level's expected
    counts μ = n_j f of ``counts``, with the level's other devices as holders of one distinct value each
    (``counts`` need not cover the population: what a long tail looks like to the collision terms)."""
    f = np.clip(np.asarray(counts, dtype=np.float64) / n, 0.0, 1.0)
    mu = n_level * f
    if spec.oracle == "hcms":
        oracle = np.asarray(spec.hcms.count_variance(tail_counts(mu, n_level))[: mu.size])
    else:
        p, q = spec.olh.support_probabilities()
        oracle = (mu * p * (1 - p) + (n_level - mu) * q * (1 - q)) / (p - q) ** 2
    sampling = n_level * f * (1 - f) * ((n - n_level) / (n - 1) if n > 1 else 0.0)
    return (n / n_level) ** 2 * (oracle + sampling)


def pem_level_support(spec: PEMSpec, records: np.ndarray, level: int, keys: np.ndarray) -> np.ndarray:
    """The oracle's statistic of each candidate key from ``records`` (all levels; the level's are used):
    OLH's exact support counts C_x, or under HCMS the sketch's debiased count n̂_{j,x} of the level's
    reports (one fast Walsh–Hadamard transform of the level's sketch, then k look-ups per key)."""
    sel = records["level"] == level
    if spec.oracle == "hcms":
        sums = sketch_sums(spec.hcms)
        add_sketch(spec.hcms, records[sel], sums)
        return _Sketch(spec.hcms, int(np.count_nonzero(sel)), sums).counts(keys)
    return olh_candidate_support(records["seed"][sel], records["y"][sel], spec.olh.hash_range, keys)


def _with_intervals(raws: np.ndarray, est: np.ndarray, var: np.ndarray, confidence: float) -> list[HeavyHitter]:
    z = z_value(confidence)
    sd = np.sqrt(np.maximum(var, 0.0))
    order = np.argsort(-est, kind="stable")
    return [
        HeavyHitter(bytes(raws[i]), float(est[i]), float(var[i]), float(est[i] - z * sd[i]), float(est[i] + z * sd[i]))
        for i in order
    ]


def pem_level_estimate(spec: PEMSpec, records: np.ndarray, level: int, rows: np.ndarray) -> tuple[np.ndarray, int]:
    """``(n̂_x for each candidate row, n_j)``: population counts of the candidates' prefixes at ``level``
    from that level's reports (module docstring). ``records`` must be checked already."""
    n = int(records.shape[0])
    sel = records["level"] == level
    keys = prefix_keys(rows, spec.level_bits(level))
    support = pem_level_support(spec, records, level, keys)
    return _level_estimate(spec, level, support, n, int(np.count_nonzero(sel)))


def _level_estimate(spec: PEMSpec, level: int, support: np.ndarray, n: int, n_j: int) -> tuple[np.ndarray, int]:
    if n_j == 0:
        raise BatchError(f"pem: no report at level {level} of {spec.num_levels}; discovery needs every level")
    if spec.oracle == "hcms":  # the sketch's counts are already debiased: scale to the population
        return np.asarray(support, dtype=np.float64) * (n / n_j), n_j
    p, q = spec.olh.support_probabilities()
    return (support - n_j * q) / (p - q) * (n / n_j), n_j


#: ``(level, candidate keys) -> (C_x for each key, n_j, n)``: a PEM level's exact support counts,
#: its reports and all the reports (the same n at every level)
LevelSupport = Callable[[int, np.ndarray], tuple[np.ndarray, int, int]]


def discover_pem(
    spec: PEMSpec,
    records: np.ndarray,
    top: int,
    keep: int | None = None,
    confidence: float = 0.95,
    *,
    alphabet: bytes | None = None,
    ranking: str = "posterior",
) -> Discovery:
    """Decode PEM reports level by level, keeping ``keep`` candidates (default 2·top; see the module docstring).

    ``alphabet``: if given, only candidates made of these bytes (:func:`alphabet_prefixes`).
    ``ranking``: ``"posterior"`` (default; :mod:`estimator.mechanisms.pem_posterior`, keeping 4·keep
    candidates at level 0 and 2·keep after) or ``"estimate"`` (each level by its own estimate, as before).
    Returns every last-level candidate with its estimate, best first."""
    t0 = time.perf_counter()
    if records.dtype != spec.record_dtype:
        raise BatchError(f"pem: records of dtype {records.dtype} are not this spec's {spec.record_dtype}")
    spec.check_records(records)

    def support(level: int, keys: np.ndarray) -> tuple[np.ndarray, int, int]:
        n_level = int(np.count_nonzero(records["level"] == level))
        return pem_level_support(spec, records, level, keys), n_level, int(records.shape[0])

    return discover_pem_from(spec, support, top, keep, confidence, t0=t0, alphabet=alphabet, ranking=ranking)


def discover_pem_from(
    spec: PEMSpec,
    support: LevelSupport,
    top: int,
    keep: int | None = None,
    confidence: float = 0.95,
    *,
    t0: float | None = None,
    alphabet: bytes | None = None,
    ranking: str = "posterior",
) -> Discovery:
    """:func:`discover_pem` over reports seen only through ``support`` (each level's support counts
    of the candidates' keys, from wherever the reports are: ``estimator.jobs.heavy_hitters_spark``)."""
    if alphabet is not None and not alphabet.strip(b"\x00"):
        raise BatchError("pem: an alphabet needs at least one non-zero byte")
    check_ranking(spec, ranking)
    t0 = time.perf_counter() if t0 is None else t0
    if top < 1:
        raise BatchError(f"top must be at least 1, got {top}")
    c = 2 * top if keep is None else keep
    if alphabet is None:
        rows = enumerate_prefixes(spec.level_bits(0), spec.length)
    else:
        rows = enumerate_alphabet_prefixes(spec.level_bits(0), spec.length, alphabet)
    if ranking == "posterior":
        return _discover_pem_posterior(spec, support, rows, top, c, confidence, t0, alphabet)
    n = 0
    ranked: list[int] = []
    est = np.zeros(0)
    n_j = 0
    for j in range(spec.num_levels):
        if j:
            rows = extend_prefixes(rows[:c], spec.level_bits(j - 1), spec.level_bits(j))
        possible = possible_prefixes(rows, spec.level_bits(j), j == spec.num_levels - 1, spec.end_marker)
        if alphabet is not None:
            possible &= alphabet_prefixes(rows, spec.level_bits(j), alphabet)
        rows = rows[possible]
        counts, n_level, n = support(j, prefix_keys(rows, spec.level_bits(j)))
        est, n_j = _level_estimate(spec, j, counts, n, n_level)
        order = np.argsort(-est, kind="stable")
        rows, est = rows[order], est[order]
        ranked.append(int(rows.shape[0]))
    var = pem_count_variance(spec, np.clip(est, 0.0, n), n, n_j)
    found = _with_intervals(rows, est, var, confidence)
    return Discovery("pem", n, found, ranked, time.perf_counter() - t0)


def extend_prefixes_pruned(
    rows: np.ndarray, bits: int, new_bits: int, alphabet: bytes | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(extensions, parent)``: the rows of :func:`extend_prefixes` (same order), built a byte's part at a
    time without unpacking bits, and with ``alphabet`` pruned after each part (:func:`alphabet_prefixes`),
    so a wide step over a small alphabet never materialises all 2^(new − old) extensions;
    ``parent[i]`` is the row extension i grew from."""
    parent = np.arange(rows.shape[0])
    b = bits
    while b < new_bits:
        k = min(new_bits - b, 8 - b % 8)
        byte, off = divmod(b, 8)
        tails = (np.arange(2**k, dtype=np.uint16) << (8 - off - k)).astype(np.uint8)
        grown = np.repeat(rows, 2**k, axis=0)
        grown[:, byte] |= np.tile(tails, rows.shape[0])
        parent = np.repeat(parent, 2**k)
        b += k
        if alphabet is not None:
            ok = alphabet_prefixes(grown, b, alphabet)
            grown, parent = grown[ok], parent[ok]
        rows = grown
    return rows, parent


def _discover_pem_posterior(
    spec: PEMSpec,
    support: LevelSupport,
    rows: np.ndarray,
    top: int,
    c: int,
    confidence: float,
    t0: float,
    alphabet: bytes | None,
) -> Discovery:
    """PEM ranked by posterior probability (:mod:`estimator.mechanisms.pem_posterior`): 4·c candidates kept
    at level 0, 2·c at later levels up to 3·10^5 reports, c above (:func:`posterior_beam`; the widths tuned
    on seeds 4-9, docs/HEAVY_HITTERS.md); the last level
    is listed by posterior, its first ``top`` by estimate; counts and intervals are the last level's."""
    ranked: list[int] = []
    chains: PosteriorChains | None = None
    score = np.zeros(0)
    est = np.zeros(0)
    n = n_j = 0
    for j in range(spec.num_levels):
        bits = spec.level_bits(j)
        parent = np.arange(rows.shape[0])
        if j:
            rows, parent = extend_prefixes_pruned(rows, spec.level_bits(j - 1), bits, alphabet)
        possible = possible_prefixes(rows, bits, j == spec.num_levels - 1, spec.end_marker)
        if alphabet is not None:
            possible &= alphabet_prefixes(rows, bits, alphabet)
        rows, parent = rows[possible], parent[possible]
        counts, n_level, n = support(j, prefix_keys(rows, bits))
        est, n_j = _level_estimate(spec, j, counts, n, n_level)
        ranked.append(int(rows.shape[0]))
        var0 = float(pem_count_variance(spec, np.zeros(1), n, n_j)[0])
        if chains is None:  # level 0: both posteriors rise with the estimate alone
            first = np.argsort(-est, kind="stable")[: posterior_beam(n)[0] * c if spec.num_levels > 1 else est.size]
            rows, est = rows[first], est[first]
            chains = PosteriorChains(est, var0, n)
        else:
            chains.extend(parent, est, var0)
        score = chains.score()
        if j < spec.num_levels - 1 and j:
            best = np.argsort(-score, kind="stable")[: posterior_beam(n)[1] * c]
            chains.keep(best)
            rows, est, score = rows[best], est[best], score[best]
    order = np.argsort(-score, kind="stable")
    head = order[:top]
    order = np.concatenate([head[np.argsort(-est[head], kind="stable")], order[top:]])
    rows, est = rows[order], est[order]
    var = pem_count_variance(spec, np.clip(est, 0.0, n), n, n_j)
    found = [
        HeavyHitter(bytes(rows[i]), float(est[i]), float(var[i]), lo, hi)
        for i, (lo, hi) in enumerate(_intervals(est, var, confidence))
    ]
    return Discovery("pem", n, found, ranked, time.perf_counter() - t0)


def _intervals(est: np.ndarray, var: np.ndarray, confidence: float) -> list[tuple[float, float]]:
    z = z_value(confidence)
    sd = np.sqrt(np.maximum(var, 0.0))
    return [(float(e - z * s), float(e + z * s)) for e, s in zip(est.tolist(), sd.tolist(), strict=True)]


def sketch_sums(spec: Any) -> dict[str, np.ndarray]:
    """Zero integer sums of a CMS (``ones``, ``rows``) or HCMS (``signed``) sketch of ``spec``."""
    k, m = spec.num_hashes, spec.width
    if isinstance(spec, CMSSpec):
        return {"ones": np.zeros((k, m), dtype=np.int64), "rows": np.zeros(k, dtype=np.int64)}
    return {"signed": np.zeros((k, m), dtype=np.int64)}


def add_sketch(spec: Any, records: np.ndarray, sums: dict[str, np.ndarray]) -> None:
    """Add CMS/HCMS ``records`` into ``sums`` (:func:`sketch_sums`): exact int64, so sums of parts add up."""
    if not records.shape[0]:
        return
    if isinstance(spec, CMSSpec):
        cms_add(records["row"], records["bits"], sums["ones"], sums["rows"])
    else:
        hcms_add(records["row"], records["col"], records["bit"], sums["signed"])


class _Sketch:
    """A CMS or HCMS sketch matrix M of some reports, and its debiased count mean at any keys."""

    def __init__(self, spec: Any, n: int, sums: dict[str, np.ndarray]) -> None:
        """The sketch of ``n`` reports whose :func:`sketch_sums` add up to ``sums``."""
        self.spec, self.n = spec, n
        k = spec.num_hashes
        if isinstance(spec, CMSSpec):
            half = sums["rows"][:, None] / 2.0
            self.matrix = k * (spec.c_eps * (sums["ones"] - half) + half)
        else:
            self.matrix = k * spec.c_eps * fwht(sums["signed"]).astype(np.float64)

    def counts(self, keys: np.ndarray) -> np.ndarray:
        """f̂(x) = m/(m-1)((1/k) Σ_j M[j, h_j(x)] - n/m) (estimator/oracles/cms.py)."""
        m = float(self.spec.width)
        means = sketch_row_means(self.matrix, self.spec.row_seeds, keys)
        return m / (m - 1.0) * (means - self.n / m)


def discover_sfp(
    spec: SFPSpec, records: np.ndarray, top: int, fragments: int | None = None, confidence: float = 0.95
) -> Discovery:
    """Assemble words from SFP's fragment sketches and rank them by the word sketch (module docstring).

    ``fragments`` (default 4·top) fragment keys survive per position."""
    t0 = time.perf_counter()
    if records.dtype != spec.record_dtype:
        raise BatchError(f"sfp: records of dtype {records.dtype} are not this spec's {spec.record_dtype}")
    spec.check_records(records)
    f_records = spec.part_records(records, "f_")
    positions = []
    for pos in range(spec.num_positions):
        sel = records["position"] == pos
        sums = sketch_sums(spec.fragment_spec)
        add_sketch(spec.fragment_spec, f_records[sel], sums)
        positions.append((int(np.count_nonzero(sel)), sums))
    word = sketch_sums(spec.word_spec)
    add_sketch(spec.word_spec, spec.part_records(records, "w_"), word)
    return discover_sfp_from(spec, int(records.shape[0]), positions, word, top, fragments, confidence, t0=t0)


def discover_sfp_from(
    spec: SFPSpec,
    n: int,
    positions: Sequence[tuple[int, dict[str, np.ndarray]]],
    word_sums: dict[str, np.ndarray],
    top: int,
    fragments: int | None = None,
    confidence: float = 0.95,
    *,
    t0: float | None = None,
) -> Discovery:
    """:func:`discover_sfp` over ``n`` reports seen only through their sketches' integer sums
    (:func:`sketch_sums`): per fragment position (reports there, fragment sketch), and the word sketch."""
    t0 = time.perf_counter() if t0 is None else t0
    if top < 1:
        raise BatchError(f"top must be at least 1, got {top}")
    keep = 4 * top if fragments is None else fragments
    all_keys = np.arange(2 ** (16 + spec.hash_bits), dtype=np.uint32)
    survivors: list[dict[int, list[int]]] = []  # per position: tag -> fragments
    for pos, (n_pos, sums) in enumerate(positions):
        if not n_pos:
            raise BatchError(f"sfp: no fragment report at position {pos}; discovery needs every position")
        est = _Sketch(spec.fragment_spec, n_pos, sums).counts(all_keys)
        if spec.end_marker:  # fragments no end_marker-1 value has at this position cannot survive
            est[~_possible_fragments(pos)[all_keys & 0xFFFF]] = -np.inf
        best = np.argpartition(-est, keep - 1)[:keep] if keep < est.size else np.arange(est.size)
        by_tag: dict[int, list[int]] = {}
        for key in best[np.argsort(-est[best], kind="stable")]:
            by_tag.setdefault(int(key) >> 16, []).append(int(key) & 0xFFFF)
        survivors.append(by_tag)
    words: list[bytes] = []
    word_tags: list[int] = []
    for tag in sorted(set.intersection(*(set(s) for s in survivors))):
        combos: list[bytes] = [b""]
        for by_tag in survivors:
            combos = [w + f.to_bytes(2, "big") for w in combos for f in by_tag[tag]]
        words.extend(combos)
        word_tags.extend([tag] * len(combos))
    rows = np.frombuffer(b"".join(words), dtype=np.uint8).reshape(len(words), spec.length).copy()
    # a word stands only if its own tag r(w) is the tag its fragments carried
    rows = rows[spec.word_tags(rows).astype(np.int64) == np.array(word_tags, dtype=np.int64)]
    if spec.end_marker and rows.shape[0]:
        rows = rows[possible_prefixes(rows, 8 * spec.length, True, spec.end_marker)]
    word_sketch = _Sketch(spec.word_spec, n, word_sums)
    keys = spec.word_keys(rows)
    est = word_sketch.counts(keys) if rows.shape[0] else np.zeros(0)
    var = _sketch_variance(spec, est, n)
    est = without_heavy_collisions(spec.word_spec, keys, est, var, confidence)
    found = _with_intervals(rows, est, var, confidence)
    return Discovery("sfp", n, found, [len(words), int(rows.shape[0])], time.perf_counter() - t0)


def without_heavy_collisions(
    sketch: CMSSpec | HCMSSpec, keys: np.ndarray, est: np.ndarray, var: np.ndarray, confidence: float = 0.95
) -> np.ndarray:
    r"""The candidates' sketch estimates less what the significant ones among them put in their cells.

    Given the hash family, a count-mean sketch's estimate of d has mean

        E[f̂(d) | h] = n_d + m/(m-1) Σ_{x≠d} n_x (r_x(d) - 1/m),   r_x(d) = (1/k) #{j: h_j(x) = h_j(d)}

    (:meth:`CMSSpec.count_variance`'s E[Y_i | h] = r_i, for CMS and HCMS alike): zero on average over
    the family, but a word that shares one of k rows' cells with a word of 13,000 holders gains
    13,000/k, 1.3 standard deviations of SFP's word sketch at ε = 4 and n = 10^5 (more where two rows
    collide); with hundreds of candidates a few always do, and those were the untyped words that passed a
    per-word test. The
    candidates whose estimate is significant among all of them (Bonferroni, :func:`noise_test`) are the
    known x here: their estimates n̂_x are subtracted with their own r_x(d), every other holder's share
    stays in the noise (and in the variance, which keeps its family-averaged collision term, so it is a
    slight over-estimate)."""
    if est.size < 2:
        return est
    _, noise = noise_test(est, np.sqrt(np.maximum(var, 0.0)), int(est.size), confidence)
    heavy = np.nonzero(~noise)[0]
    if not heavy.size:
        return est
    m = float(sketch.width)
    pos = sketch.hash_positions(keys)  # (k, N)
    shift = np.zeros(est.size)
    for x in heavy.tolist():
        r = (pos == pos[:, x : x + 1]).mean(axis=0)
        r[keys == keys[x]] = 1.0 / m  # the word itself (and any other candidate with its key) is not a collision
        shift += est[x] * (r - 1.0 / m)
    return np.asarray(est - m / (m - 1.0) * shift)


def _possible_fragments(position: int) -> np.ndarray:
    """Which of the 2^16 two-byte fragments an ``end_marker`` 1 value can have at ``position``: no
    control byte, nothing but 0x00 after a 0x00, and not 0x00 first in the value."""
    hi, lo = np.divmod(np.arange(2**16), 256)
    ok = ~_RESERVED[hi] & ~_RESERVED[lo] & ((hi != 0) | (lo == 0))
    if position == 0:
        ok &= hi != 0
    return np.asarray(ok)


def _sketch_variance(spec: SFPSpec, est: np.ndarray, n: int) -> np.ndarray:
    """The word sketch's variance (``count_variance`` of CMS/HCMS) at the estimated counts: the found
    words' estimates, and the devices they leave as holders of one distinct word each (what a long tail
    looks like to the collision terms), with n devices in all (:func:`tail_counts`)."""
    if est.size == 0:
        return np.zeros(0)
    return np.asarray(spec.word_spec.count_variance(tail_counts(est, n))[: est.size])


def tail_counts(est: np.ndarray, n: float) -> np.ndarray:
    """A counts vector of ``n`` devices in all to plug into a sketch's ``count_variance``: the estimates
    clipped to [0, n], then the devices they leave as a long tail of ones. Where the clipped estimates add
    up to more than ``n`` (hundreds of candidates nobody holds, each clipped at its positive noise), they
    are projected to sum to ``n`` instead (Norm-Sub, :func:`estimator.result.norm_sub`): the sketch's
    noise grows with the number of reports, and a sum above ``n`` would inflate every variance (by about
    5× for SFP's ~500 words at ε = 1 and n = 10^5)."""
    clipped = np.clip(np.asarray(est, dtype=np.float64), 0.0, float(n))
    if clipped.sum() > n:
        return norm_sub(clipped, float(n))
    rest = max(0, int(round(n - clipped.sum())))
    return np.concatenate([clipped, np.ones(rest)])


def discover(
    spec: PEMSpec | SFPSpec, records: np.ndarray, top: int, confidence: float = 0.95, *, ranking: str | None = None
) -> Discovery:
    """:func:`discover_pem` or :func:`discover_sfp`, by the spec's kind; ``ranking`` is PEM's
    (:func:`check_ranking`; ``None``: its default)."""
    check_ranking(spec, ranking)
    if isinstance(spec, PEMSpec):
        return discover_pem(spec, records, top, confidence=confidence, ranking=ranking or PEM_RANKINGS[0])
    return discover_sfp(spec, records, top, confidence=confidence)


def check_ranking(spec: PEMSpec | SFPSpec, ranking: str | None) -> None:
    """A clear :class:`BatchError` for a ``ranking`` that is not PEM's, or one given for an SFP metric."""
    if ranking is None:
        return
    if not isinstance(spec, PEMSpec):
        raise BatchError(f"a ranking ({ranking!r}) applies to pem metrics only; {spec.name} has none to choose")
    if ranking not in PEM_RANKINGS:
        raise BatchError(f"pem: ranking must be one of {', '.join(PEM_RANKINGS)}, got {ranking!r}")


@dataclasses.dataclass(frozen=True)
class StreamingSummary:
    """What the streaming estimator can say about a heavy-hitter metric from linear sums alone.

    Discovery needs every level's reports at once (``ldp heavy-hitters``); the
    streaming state keeps how many reports each level (PEM) or fragment
    position (SFP) got and, for PEM, the first level's support counts, so it
    shows the most frequent first-level prefixes with their intervals."""

    n: int
    parts: list[int]
    prefixes: list[list[Any]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "reports_per_part": self.parts,
            "first_level_prefixes": self.prefixes,
            "discovery": "run `ldp heavy-hitters` over the dataset for whole values",
        }


class HeavyHitterStreamState(LinearState):
    """Linear sums of heavy-hitter reports for the streaming estimator (see :class:`StreamingSummary`)."""

    spec_type = (PEMSpec, SFPSpec)  # type: ignore[assignment]
    spec: PEMSpec | SFPSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        if isinstance(self.spec, PEMSpec) and self.spec.oracle == "hcms":
            return {"parts": np.zeros(self.spec.num_levels, dtype=np.int64), **sketch_sums(self.spec.hcms)}
        if isinstance(self.spec, PEMSpec):
            return {
                "parts": np.zeros(self.spec.num_levels, dtype=np.int64),
                "first": np.zeros(2 ** self.spec.level_bits(0), dtype=np.int64),
            }
        return {"parts": np.zeros(self.spec.num_positions, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        self.spec.check_records(records)
        field = "level" if isinstance(self.spec, PEMSpec) else "position"
        self.sums["parts"] += np.bincount(records[field], minlength=self.sums["parts"].size)
        if isinstance(self.spec, PEMSpec) and self.spec.oracle == "hcms":
            add_sketch(self.spec.hcms, records[records["level"] == 0], self.sums)
        elif isinstance(self.spec, PEMSpec):
            sel = records["level"] == 0
            keys = np.arange(self.sums["first"].size, dtype=np.uint32)  # b ≤ 31 bits: the key is the prefix
            self.sums["first"] += olh_candidate_support(
                records["seed"][sel], records["y"][sel], self.spec.olh.hash_range, keys
            )

    def estimate(self, confidence: float = 0.95, top: int = 20) -> StreamingSummary:
        prefixes: list[list[Any]] = []
        spec = self.spec
        n0 = int(self.sums["parts"][0]) if isinstance(spec, PEMSpec) else 0
        if isinstance(spec, PEMSpec) and n0 and self.n:
            if spec.oracle == "hcms":
                keys = np.arange(2 ** spec.level_bits(0), dtype=np.uint32)
                est = _Sketch(spec.hcms, n0, {"signed": self.sums["signed"]}).counts(keys) * (self.n / n0)
            else:
                p, q = spec.olh.support_probabilities()
                est = (self.sums["first"] - n0 * q) / (p - q) * (self.n / n0)
            var = pem_count_variance(spec, np.clip(est, 0.0, self.n), self.n, n0)
            rows = enumerate_prefixes(spec.level_bits(0), spec.length)
            ranked = _with_intervals(rows, est, var, confidence)
            # could be noise: Bonferroni over all 2^s first-level prefixes (estimator.result.noise_test)
            _, noise = noise_test(
                np.array([h.estimate for h in ranked]),
                np.sqrt(np.maximum([h.variance for h in ranked], 0.0)),
                len(ranked),
                confidence,
            )
            for h, z in zip(ranked[:top], noise[:top].tolist(), strict=True):
                bits = spec.level_bits(0)
                prefixes.append([h.raw[: -(-bits // 8)].hex(), bits, h.estimate, h.ci_low, h.ci_high, bool(z)])
        return StreamingSummary(self.n, [int(x) for x in self.sums["parts"]], prefixes)
