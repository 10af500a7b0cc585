"""``ldp simulate``: a seeded collection, printed against the truth."""

from __future__ import annotations

import argparse
import json
import secrets
from typing import Any

import numpy as np

from ldp_cli.progress import add_progress_flags
from ldp_cli.progress import bar as progress_bar
from ldp_core.mechanisms import FREQUENCY_MECHANISMS, HEAVY_HITTER_MECHANISMS, NUMERIC_MECHANISMS
from pipeline.text import printable

# The simulator's modules are imported by the function that runs each kind of mechanism, so that a
# frequency-oracle job (or ``ldp simulate --help``) does not load the heavy-hitter and numeric code.


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="privatize a simulated population with a real encoder and estimate its counts, mean or distribution",
        description="Draw N users' true values, privatize them with the real encoders, "
        "aggregate with the real estimator and print estimates against the truth. Frequency oracles "
        f"({', '.join(sorted(FREQUENCY_MECHANISMS))}) take --domain; the numeric mechanisms "
        f"({', '.join(NUMERIC_MECHANISMS)}) take --range LO:HI (sw and dbitflip also --bins). loloha (memoized local hashing) is a frequency "
        "oracle: --domain. The heavy-hitter mechanisms (pem, sfp) discover frequent strings: --input FILE "
        "(one value per line, or value<TAB>count) or --users N --distribution zipf:S.",
    )
    p.add_argument(
        "--mechanism",
        required=True,
        choices=sorted(FREQUENCY_MECHANISMS) + list(NUMERIC_MECHANISMS) + list(HEAVY_HITTER_MECHANISMS),
    )
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--domain", type=int, default=None, help="domain size D of a frequency oracle (rr: always 2)")
    p.add_argument("--range", default=None, metavar="LO:HI", help="the value range of a numeric mechanism")
    p.add_argument(
        "--bins", type=int, default=None, help="sw: histogram bins (default 256); dbitflip: buckets (default 32)"
    )
    p.add_argument(
        "--bootstrap", type=int, default=50, help="sw: bootstrap resamples for the intervals (default 50; 0: none)"
    )
    p.add_argument("--users", type=int, default=None, help="number of users (required unless --input)")
    p.add_argument(
        "--input",
        default=None,
        metavar="FILE",
        help="pem, sfp: the population, one value per line or value<TAB>count (instead of --users)",
    )
    p.add_argument(
        "--length",
        type=int,
        default=None,
        help="pem, sfp: value length in bytes (default: the longest --input value; 6 for synthetic words)",
    )
    p.add_argument(
        "--oracle",
        choices=("olh", "hcms"),
        default="olh",
        help="pem: the frequency oracle of every level, OLH (default) or the Hadamard count-mean sketch "
        "(one bit per report, one fast Walsh-Hadamard transform per level; docs/HEAVY_HITTERS.md)",
    )
    p.add_argument(
        "--alphabet",
        default=None,
        help="pem: the characters every value is made of (e.g. abcdefghijklmnopqrstuvwxyz); the server keeps "
        "only candidates over them and takes fewer, wider levels (docs/HEAVY_HITTERS.md, 'A known alphabet')",
    )
    p.add_argument(
        "--distribution",
        default=None,
        help="frequency: zipf:S or uniform (default zipf:1.1); numeric: uniform, beta:A,B, normal:MU,SD or zipf:S "
        "(default beta:2,5)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the simulation's generator (default: random)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    add_progress_flags(p)  # the bar over users on stderr: a terminal only, not with --json, unless --progress
    p.add_argument("--top", type=int, default=20, help="rows of the table (default 20)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.mechanism in HEAVY_HITTER_MECHANISMS:
        return run_heavy_hitters(args)
    if args.input is not None or args.length is not None or args.oracle != "olh" or args.alphabet is not None:
        raise ValueError(
            f"--input, --length, --oracle and --alphabet are for the heavy-hitter mechanisms (pem, sfp), "
            f"not {args.mechanism}"
        )
    if args.users is None:
        raise ValueError("--users is required")
    if args.mechanism in NUMERIC_MECHANISMS:
        return run_numeric(args)
    if args.range is not None or args.bins is not None:
        raise ValueError(f"--range and --bins are for the numeric mechanisms, not {args.mechanism}; use --domain")
    from simulator.population import parse_distribution
    from simulator.run import simulate, spec_for

    args.distribution = args.distribution or "zipf:1.1"
    domain = 2 if args.mechanism == "rr" else args.domain
    if domain is None:
        raise ValueError(f"--domain is required for {args.mechanism}: give the number of distinct values (at least 2)")
    if args.mechanism == "rr" and args.domain not in (None, 2):
        raise ValueError(
            f"rr (binary randomized response) has domain 2, got --domain {args.domain}; use grr for larger domains"
        )
    seed = _check_common(args)
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    spec = spec_for(args.mechanism, args.epsilon, domain)
    dist = parse_distribution(args.distribution, domain)
    rng = np.random.default_rng(seed)

    with _progress(args) as bar:
        result = simulate(spec, args.users, dist, rng, seed=seed, progress=bar.update)

    if args.json:
        print(json.dumps(result.to_json_obj()))
        return 0
    est, truth, var = result.estimate, result.true_counts, result.variance
    print(f"{spec.name}  ε={spec.epsilon:g}  d={spec.domain_size}  n={args.users}  seed={seed}  spec_id={spec.spec_id}")
    print(
        f"timings: encode {result.seconds['encode']:.3f}s  aggregate {result.seconds['aggregate']:.3f}s  estimate {result.seconds['estimate']:.3f}s"
    )
    order = np.argsort(-truth, kind="stable")[: args.top]
    noise = est.noise()[1]
    print(f"{'item':>8} {'true':>10} {'estimate':>12} {'95% CI':>27} {'theory sd':>10}")
    for i in order:
        print(
            f"{i:>8} {truth[i]:>10} {est.counts[i]:>12.1f}  [{est.ci_low[i]:>11.1f}, {est.ci_high[i]:>11.1f}] "
            f"{np.sqrt(var[i]):>10.1f}" + ("  could be noise" if noise[i] else "")
        )
    acc = result.accuracy()
    print(
        f"standardized errors: mean {acc['z_mean']:+.3f}, variance {acc['z_variance']:.3f}; CI coverage "
        f"{acc['ci_coverage']:.3f}; MSE {acc['mse']:.4g} (theory {acc['theory_mse']:.4g})"
    )
    return 0


def _progress(args: argparse.Namespace) -> Any:
    """A bar over ``--users`` on stderr, by the rule of :mod:`ldp_cli.progress`."""
    return progress_bar(args, f"ldp simulate {args.mechanism}", "user", total=args.users)


def _check_common(args: argparse.Namespace) -> int:
    if args.users < 1:
        raise ValueError(f"--users must be at least 1, got {args.users}")
    if args.seed is not None and not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    return args.seed if args.seed is not None else secrets.randbits(63)


def run_numeric(args: argparse.Namespace) -> int:
    if args.domain is not None:
        raise ValueError(f"{args.mechanism} estimates a number: give --range LO:HI, not --domain")
    if args.range is None:
        raise ValueError(f"--range LO:HI is required for {args.mechanism}")
    if args.bootstrap < 0:
        raise ValueError(f"--bootstrap must be at least 0, got {args.bootstrap}")
    from simulator.numeric import NumericPopulation, numeric_spec, parse_range, simulate_numeric

    lo, hi = parse_range(args.range)
    seed = _check_common(args)
    spec = numeric_spec(args.mechanism, args.epsilon, lo, hi, args.bins)
    population = NumericPopulation(args.distribution or "beta:2,5", lo, hi)
    rng = np.random.default_rng(seed)
    with _progress(args) as bar:
        out = simulate_numeric(
            spec, args.users, population, rng, seed=seed, bootstrap=args.bootstrap, progress=bar.update
        )
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"{spec.name}  ε={spec.epsilon:g}  range [{lo:g}, {hi:g}]  n={args.users}  seed={seed}  spec_id={spec.spec_id}"
    )
    secs = out["seconds"]
    print(
        f"timings: encode {secs['encode']:.3f}s  aggregate {secs['aggregate']:.3f}s  estimate {secs['estimate']:.3f}s"
    )
    if "mean" in out:
        print(
            f"true mean {out['true_mean']:.6g}   estimate {out['mean']:.6g}   95% CI [{out['ci_low']:.6g}, "
            f"{out['ci_high']:.6g}]   theory sd {np.sqrt(out['mean_variance']):.4g}"
        )
        return 0
    for name, q in out["quantiles"].items():
        print(
            f"{name:>4}: true {out['true_quantiles'][name]:.5g}   estimate {q['value']:.5g}   "
            f"95% CI [{q['ci_low']:.5g}, {q['ci_high']:.5g}]"
        )
    tv = 0.5 * float(np.abs(np.array(out["hist"]) - np.array(out["true_hist"])).sum())
    print(f"histogram of {out['bins']} bins: total variation from the truth {tv:.4f}; EMS steps {out['iterations']}")
    return 0


def run_heavy_hitters(args: argparse.Namespace) -> int:
    """``ldp simulate --mechanism pem|sfp``: discovery over a file's or a synthetic population of strings."""
    from simulator.heavy_hitters import read_population, simulate_heavy_hitters, synthetic_population
    from simulator.population import parse_distribution

    if args.range is not None or args.bins is not None:
        raise ValueError(f"--range and --bins are for the numeric mechanisms, not {args.mechanism}")
    if args.top < 1:
        raise ValueError(f"--top must be at least 1, got {args.top}")
    if args.length is not None and not 1 <= args.length <= 64:
        raise ValueError(f"--length must be between 1 and 64 bytes, got {args.length}")
    if args.input is not None:
        if args.users is not None or args.distribution is not None or args.domain is not None:
            raise ValueError("--input is the population: do not give --users, --distribution or --domain with it")
        population = read_population(args.input)
        seed = args.seed if args.seed is not None else secrets.randbits(63)
        if not 0 <= seed < 2**63:
            raise ValueError(f"--seed must be an integer in [0, 2**63), got {seed}")
        rng = np.random.default_rng(seed)
    else:
        if args.users is None:
            raise ValueError(f"{args.mechanism} needs --input FILE or --users N (with --distribution zipf:S)")
        seed = _check_common(args)
        rng = np.random.default_rng(seed)
        dist = parse_distribution(args.distribution or "zipf:1.1", args.domain or 10_000)
        population = synthetic_population(args.users, dist, args.length or 6, rng)
    if args.oracle != "olh" and args.mechanism != "pem":
        raise ValueError(f"--oracle is PEM's frequency oracle; {args.mechanism} has its own sketches")
    out = simulate_heavy_hitters(
        args.mechanism,
        args.epsilon,
        population,
        args.top,
        rng,
        seed=seed,
        length=args.length,
        oracle=args.oracle,
        alphabet=args.alphabet,
    )
    if args.json:
        print(json.dumps(out))
        return 0
    secs = out["seconds"]
    print(
        f"{args.mechanism}  ε={out['epsilon']:g}  n={out['users']}  length={out['length']}  seed={seed}  "
        f"encode {secs['encode']:.3f}s  decode {secs['decode']:.3f}s"
    )
    truth = dict((v, c) for v, c in out["true_top"])
    print(f"{'rank':>4}  {'value':<24} {'estimate':>12} {'95% CI':>27} {'true':>10}")
    for rank, ((value, est, lo, hi), noise) in enumerate(zip(out["found"], out["could_be_noise"]), 1):
        true = truth.get(value)
        print(
            f"{rank:>4}  {printable(value):<24} {est:>12.1f}  [{lo:>11.1f}, {hi:>11.1f}] "
            f"{true if true is not None else '-':>10}" + ("  could be noise" if noise else "")
        )
    print(f"recall@{args.top} {out['recall']:.3f}   precision@{args.top} {out['precision']:.3f}")
    print(f"could be noise: the 95% interval widened for {out['candidates']} candidates (Bonferroni) reaches 0")
    return 0
