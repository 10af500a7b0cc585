"""RAPPOR's server-side design (estimator.oracles.rappor_design): the fast build
against the numpy reference, and the in-process and on-disk caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from estimator.oracles import rappor_design as rd
from estimator.oracles.rappor import RapporAccumulator
from ldp_core.errors import SpecError
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.rappor import RapporDesign, RapporSpec

EPS64 = np.finfo(np.float64).eps


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets an empty cache directory and an empty in-process LRU."""
    monkeypatch.setenv("LDP_CACHE_DIR", str(tmp_path / "cache"))
    rd.clear_memory_cache()
    yield tmp_path / "cache"
    rd.clear_memory_cache()


def filled(spec: RapporSpec, n: int, seed: int) -> RapporAccumulator:
    rng = np.random.default_rng(seed)
    acc = RapporAccumulator(spec)
    acc.update(spec.encode(rng.integers(0, spec.domain_size, size=n), rng))
    return acc


REFERENCE_SPECS = [
    RapporSpec(epsilon=2.0, domain_size=16),
    RapporSpec(epsilon=4.0, domain_size=32, num_bits=16, num_cohorts=4),
    RapporSpec(epsilon=1.0, domain_size=8, num_bits=8, num_cohorts=2, num_hashes=1, p=0.0, q=1.0),
    RapporSpec(epsilon=6.0, domain_size=24, num_bits=24, num_cohorts=4, num_hashes=3, p=0.25, q=0.75),
    make_spec("rappor", epsilon=2.0, domain_size=256),
]


@pytest.mark.parametrize("spec", REFERENCE_SPECS, ids=lambda s: f"d{s.domain_size}-k{s.num_bits}-m{s.num_cohorts}")
def test_fast_build_equals_the_reference_to_rounding(spec: RapporSpec) -> None:
    """H, K, diag(G⁻¹), the counts and the variance agree with the numpy reference
    (LU inverse of G) to float64 rounding. Both routes are backward stable, so an
    entry of G⁻¹ (and the sums of products H, K built from it) carries a relative
    error of order d·κ(G)·u, and the counts m G⁻¹ b one of d·κ(G)·u·m |G⁻¹||b|
    (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 10.1
    and 14.3); the tolerance is 16·d·κ(G)·u of
    each quantity's scale. The variance m H n + m α n diag(G⁻¹) + m β K n - n
    cancels, so its scale is the sum of the magnitudes of its terms."""
    d = spec.domain_size
    ref = RapporDesign(spec, np.arange(d))
    arrays = rd.build_design_arrays(spec)
    fast = arrays.design(spec)
    gram = arrays.chol @ arrays.chol.T
    kappa = np.linalg.cond(gram)
    tol = 16 * d * kappa * EPS64
    for name in ("h_matrix", "k_matrix", "gram_inv_diag"):
        a, b = getattr(fast, name), getattr(ref, name)
        assert np.max(np.abs(a - b)) <= tol * np.max(np.abs(b)), name
    acc = filled(spec, 5000, seed=d)
    ones, cc = acc.sums["ones"], acc.sums["cohort_counts"]
    got, want = fast.counts(ones, cc), ref.counts(ones, cc)
    xt = gram @ want / spec.num_cohorts
    scale = spec.num_cohorts * (np.abs(ref.gram_inv) @ np.abs(xt))
    assert np.all(np.abs(got - want) <= tol * scale)
    true = np.bincount(np.random.default_rng(1).integers(0, d, size=3000), minlength=d).astype(float)
    qs, ps, m = spec.q_star, spec.p_star, spec.num_cohorts
    alpha = ps * (1 - ps) / (qs - ps) ** 2
    beta = (qs * (1 - qs) - ps * (1 - ps)) / (qs - ps) ** 2
    terms = (
        m * (ref.h_matrix @ true)
        + m * alpha * true.sum() * ref.gram_inv_diag
        + m * abs(beta) * (ref.k_matrix @ true)
        + true
    )
    assert np.all(np.abs(fast.variance(true) - ref.variance(true)) <= tol * terms)


def test_fast_build_refuses_rank_deficient_designs() -> None:
    """One cohort, one hash, k = d: some bit is hit twice, so G is singular."""
    spec = RapporSpec(epsilon=1.0, domain_size=8, num_bits=8, num_cohorts=1, num_hashes=1)
    with pytest.raises(SpecError, match="rank-deficient"):
        rd.build_design_arrays(spec)


def test_cold_and_warm_estimates_are_identical(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second process's view (LRU empty, file present) loads the file, builds
    nothing, and gives bit-identical counts, variances and intervals."""
    spec = make_spec("rappor", epsilon=2.0, domain_size=64)
    cold = filled(spec, 4000, seed=3).estimate()
    path = rd.cache_path(spec, np.arange(64))
    assert path.is_file()
    rd.clear_memory_cache()

    def no_build(*_: object, **__: object) -> None:
        raise AssertionError("the design was rebuilt although a valid cache file exists")

    monkeypatch.setattr(rd, "build_design_arrays", no_build)
    fresh_spec = make_spec("rappor", epsilon=2.0, domain_size=64)
    warm = filled(fresh_spec, 4000, seed=3).estimate()
    for field in ("counts", "variance", "ci_low", "ci_high"):
        assert np.array_equal(getattr(cold, field), getattr(warm, field)), field
    assert np.array_equal(fresh_spec.count_variance(np.arange(64.0)), spec.count_variance(np.arange(64.0)))


def test_whole_domain_design_is_shared_with_count_variance() -> None:
    spec = make_spec("rappor", epsilon=2.0, domain_size=32)
    design = rd.rappor_design(spec)
    assert spec.design() is design
    assert rd.rappor_design(spec) is design


def test_candidate_subsets_are_cached_under_their_own_key(private_cache: Path) -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=40)
    sub = rd.rappor_design(spec, [3, 9, 27])
    whole = rd.rappor_design(spec)
    assert rd.cache_path(spec, np.array([3, 9, 27])) != rd.cache_path(spec, np.arange(40))
    assert sub.candidates.tolist() == [3, 9, 27] and whole.candidates.size == 40
    assert len(list((private_cache / "rappor").glob("*.npz"))) == 2


def _corrupt(path: Path, how: str, other: Path) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "byte-flipped":
        pos = len(data) // 2
        path.write_bytes(data[:pos] + bytes([data[pos] ^ 0x55]) + data[pos + 1 :])
    elif how == "garbage":
        path.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "checksum":
        with np.load(path) as npz:
            fields = {k: npz[k] for k in npz.files}
        fields["h_matrix"] = fields["h_matrix"].copy()
        fields["h_matrix"][0, 0] *= 1.5
        with open(path, "wb") as fh:
            np.savez(fh, **fields)
    elif how == "other-spec":
        path.write_bytes(other.read_bytes())
    elif how == "wrong-shape":
        with np.load(path) as npz:
            fields = {k: npz[k] for k in npz.files}
        fields["k_matrix"] = fields["k_matrix"][:-1]
        with open(path, "wb") as fh:
            np.savez(fh, **fields)
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated", "empty", "byte-flipped", "garbage", "checksum", "other-spec", "wrong-shape"]
)
def test_a_bad_cache_file_is_ignored_and_rebuilt(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = make_spec("rappor", epsilon=2.0, domain_size=48)
    other = make_spec("rappor", epsilon=3.0, domain_size=48)
    cand = np.arange(48)
    want = rd.build_design_arrays(spec)
    path = rd.store_design_arrays(spec, want)
    other_path = rd.store_design_arrays(other, rd.build_design_arrays(other))
    assert path is not None and other_path is not None
    _corrupt(path, how, other_path)
    assert rd.load_design_arrays(spec, cand) is None

    builds = []
    real_build = rd.build_design_arrays

    def counting_build(*args: object, **kwargs: object) -> rd.DesignArrays:
        builds.append(args)
        return real_build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rd, "build_design_arrays", counting_build)
    design = rd.rappor_design(spec)
    assert len(builds) == 1
    assert np.array_equal(design.h_matrix, want.h_matrix) and np.array_equal(design.k_matrix, want.k_matrix)
    reloaded = rd.load_design_arrays(spec, cand)
    assert reloaded is not None
    for name in ("chol", "h_matrix", "k_matrix", "gram_inv_diag", "candidates"):
        assert np.array_equal(getattr(reloaded, name), getattr(want, name)), name


def test_an_unwritable_cache_directory_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"x")
    monkeypatch.setenv("LDP_CACHE_DIR", str(blocker))
    spec = make_spec("rappor", epsilon=2.0, domain_size=20)
    assert rd.store_design_arrays(spec, rd.build_design_arrays(spec)) is None
    est = filled(spec, 1000, seed=5).estimate()
    assert est.counts.shape == (20,) and np.all(np.isfinite(est.variance))


_WRITER = textwrap.dedent(
    """
    import sys
    from ldp_core.mechanisms import make_spec
    from estimator.oracles import rappor_design as rd
    spec = make_spec("rappor", epsilon=2.0, domain_size=int(sys.argv[1]))
    arrays = rd.build_design_arrays(spec)
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(int(sys.argv[2])):
        assert rd.store_design_arrays(spec, arrays) is not None
    """
)


def test_concurrent_writers_never_leave_a_broken_file(private_cache: Path) -> None:
    """Two processes rewrite the same cache file 40 times each, started together,
    while this process keeps loading it: every load that finds the file gets a
    valid design, and the final file is valid with no temporary files left."""
    d, rounds = 128, 40
    env = dict(os.environ, LDP_CACHE_DIR=str(private_cache))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(d), str(rounds)],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        spec = make_spec("rappor", epsilon=2.0, domain_size=d)
        path = rd.cache_path(spec, np.arange(d))
        loads = 0
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if path.exists():
                assert rd.load_design_arrays(spec, np.arange(d)) is not None
                loads += 1
        for p in procs:
            assert p.wait(timeout=60) == 0
        assert loads > 0, "the writers finished before any concurrent load"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    final = rd.load_design_arrays(spec, np.arange(d))
    assert final is not None
    assert np.array_equal(final.h_matrix, rd.build_design_arrays(spec).h_matrix)
    assert sorted(x.name for x in path.parent.iterdir()) == [path.name]
    assert json.loads(str(np.load(path)["meta"][()]))["spec_id"] == spec.spec_id


def test_the_disk_cache_is_bounded_and_evicts_the_least_recently_used(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three designs of 40 candidates (three 40×40 float64 matrices and two vectors, about 39 kB each) under a
    budget of two and a half designs: writing the third deletes the least recently used one; a load counts as a use."""
    specs = [RapporSpec(epsilon=e, domain_size=40) for e in (1.0, 2.0, 3.0)]
    rd.rappor_design(specs[0])
    one = rd.cache_path(specs[0], np.arange(40)).stat().st_size
    monkeypatch.setenv("LDP_CACHE_MAX_BYTES", str(int(2.5 * one)))
    rd.rappor_design(specs[1])
    past = time.time() - 100
    os.utime(rd.cache_path(specs[0], np.arange(40)), (past, past))
    os.utime(rd.cache_path(specs[1], np.arange(40)), (past + 1, past + 1))
    rd.clear_memory_cache()
    assert rd.load_design_arrays(specs[0], np.arange(40)) is not None  # specs[0] used now: specs[1] is oldest
    rd.rappor_design(specs[2])
    left = {p.name for p in (private_cache / "rappor").glob("*.npz")}
    assert left == {rd.cache_path(s, np.arange(40)).name for s in (specs[0], specs[2])}


def test_a_design_larger_than_the_budget_is_not_written(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LDP_CACHE_MAX_BYTES", "1000")
    design = rd.rappor_design(RapporSpec(epsilon=2.0, domain_size=40))
    assert design.candidates.size == 40
    folder = private_cache / "rappor"
    assert not folder.exists() or not list(folder.glob("*.npz"))
    monkeypatch.setenv("LDP_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="LDP_CACHE_MAX_BYTES must be a non-negative integer"):
        rd.cache_limit()
