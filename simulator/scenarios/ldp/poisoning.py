"""Data poisoning: what a flood of crafted reports does to a frequency estimate.

Local DP protects what a device *says*; it does nothing to stop a device (or
someone posing as many devices) from saying something it did not draw from
the mechanism. A crafted report is any record the collector accepts: it
passes every check the pipeline makes (frame, metric, spec id, field
bounds), because a privatized report carries no proof that it was drawn
honestly. Cheu, Smith and Ullman ("Manipulation attacks in local
differential privacy", IEEE S&P 2021) show this is inherent to local
protocols: a few manipulators skew an estimate by far more than their
number, the more so the smaller ε.

**The attack measured here** (output manipulation, one target item ``t``):
each crafted report is the record that supports ``t`` for sure and no other
item more than an honest report would. For a pure protocol with support
probabilities ``p*`` (holder) and ``q*`` (non-holder), the unbiased count is
``(C_t − n·q*) / (p* − q*)``, so one crafted report that supports ``t``
moves it by exactly

    Δ = (1 − q*) / (p* − q*),

and ``m`` of them by ``m·Δ`` (the largest shift any ``m`` reports can cause
to one count: no record supports an item more than once). Non-target items
move by ``m·(s − q*)/(p* − q*)`` where ``s`` is how often a crafted report
happens to support them: 0 for GRR and OUE (their crafted record supports
``t`` only), ``1/g`` on average for OLH (the seed is random), so by zero in
expectation.

* GRR: the record ``value = t``.
* OUE: the bit vector with only bit ``t`` set.
* OLH: a uniformly random seed ``s`` and ``y = H_s(t)``.

**What bounds it.** Without tokens nothing bounds ``m``: the collector
accepts any well-formed upload, and the shuffler's crowd threshold counts
reports, not people. The shift is bounded only by how many reports an
attacker can get accepted. A collector run with ``--require-tokens``
(docs/TOKENS.md) accepts one upload of at most ``r = max_reports_per_day``
reports per token, and the issuer grants K tokens per enrolled install per
UTC day, so ``k`` installs move a count by at most ``k × K × r × Δ`` a day,
however many reports they craft. Central noise, norm-sub and the confidence
interval do not help: the interval is computed from the (poisoned) data and
is as narrow as for honest data.

:func:`poisoning_run` measures the attack with the real specs, encoders and
accumulators; :func:`token_attack_run` sends the crafted reports through a
real collector (uvicorn on 127.0.0.1, the embedded log) that requires the
tokens of a real issuer, from ``k`` enrolled installs, and adds what the
collector published to the same honest reports.
``python -m simulator.scenarios.ldp.poisoning`` prints the tables of
``docs/PRIVACY.md`` (``--attackers`` for the one with tokens) and draws
``docs/img/poisoning.png``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from estimator.oracles import accumulator_for
from ldp_core.mechanisms import frequency_spec, make_spec
from ldp_core.mechanisms.base import MechanismSpec
from simulator.crafted import crafted_reports, influence
from simulator.population import Distribution

__all__ = [
    "PoisoningResult",
    "TokenAttackResult",
    "crafted_reports",
    "influence",
    "poisoning_run",
    "token_attack_run",
    "main",
]


@dataclasses.dataclass(frozen=True)
class PoisoningResult:
    mechanism: str
    epsilon: float
    domain: int
    users: int
    crafted: int
    target: int
    true_count: int
    influence: float
    honest_estimate: float
    honest_ci: tuple[float, float]
    poisoned_estimate: float
    poisoned_ci: tuple[float, float]
    predicted_shift: float

    @property
    def shift(self) -> float:
        return self.poisoned_estimate - self.honest_estimate

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shift"] = self.shift
        return d


def poisoning_run(
    mechanism: str,
    epsilon: float,
    domain: int,
    users: int,
    crafted: Sequence[int],
    rng: np.random.Generator,
    *,
    target: int | None = None,
    distribution: str = "zipf",
    confidence: float = 0.95,
) -> list[PoisoningResult]:
    """Honest users (zipf or uniform values) plus ``m`` crafted reports for each ``m`` in ``crafted``.

    The honest reports are drawn once and the crafted ones added to a copy of their accumulator, so
    every row shares the same honest estimate and differs only by the attack. ``target`` defaults to
    the middle of the domain (a rare item under zipf).
    """
    spec = frequency_spec(make_spec(mechanism, epsilon=epsilon, domain_size=domain))
    t = domain // 2 if target is None else int(target)
    values = Distribution(distribution, domain).sample(users, rng)
    honest = accumulator_for(spec)
    honest.update(spec.encode(values, rng))
    h = honest.estimate(confidence)
    delta = influence(spec)
    out = []
    for m in crafted:
        acc = accumulator_for(spec)
        acc.merge(honest)
        if m:
            acc.update(crafted_reports(spec, t, int(m), rng))
        e = acc.estimate(confidence)
        out.append(
            PoisoningResult(
                mechanism=mechanism,
                epsilon=float(epsilon),
                domain=domain,
                users=users,
                crafted=int(m),
                target=t,
                true_count=int(np.count_nonzero(values == t)),
                influence=delta,
                honest_estimate=float(h.counts[t]),
                honest_ci=(float(h.ci_low[t]), float(h.ci_high[t])),
                poisoned_estimate=float(e.counts[t]),
                poisoned_ci=(float(e.ci_low[t]), float(e.ci_high[t])),
                predicted_shift=m * delta,
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class TokenAttackResult:
    """One attack through a real collector: ``attackers`` installs tried to get ``crafted`` reports accepted;
    ``accepted`` is what the collector published, ``outcomes`` its answers by ``"status reason"``."""

    mechanism: str
    epsilon: float
    domain: int
    users: int
    require_tokens: bool
    attackers: int
    tokens_per_day: int
    reports_per_upload: int
    crafted: int
    accepted: int
    outcomes: dict[str, int]
    target: int
    true_count: int
    influence: float
    honest_estimate: float
    honest_ci: tuple[float, float]
    poisoned_estimate: float
    poisoned_ci: tuple[float, float]

    @property
    def shift(self) -> float:
        return self.poisoned_estimate - self.honest_estimate

    @property
    def bound(self) -> float | None:
        """k × K × r × Δ with tokens; nothing bounds the shift without them."""
        if not self.require_tokens:
            return None
        return self.attackers * self.tokens_per_day * self.reports_per_upload * self.influence

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "shift": self.shift, "bound": self.bound}


def _metrics_doc(mechanism: str, epsilon: float, domain: int, reports_per_day: int) -> dict[str, Any]:
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            "poisoned": {
                "description": "the attacked metric",
                "owner": "poisoning@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": mechanism, "epsilon": epsilon},
                "domain": {"kind": "hashed", "size": domain, "seed": 0},
                "max_reports_per_day": reports_per_day,
            }
        },
    }


def _attack_collector(
    workdir: Path,
    spec: MechanismSpec,
    doc: dict[str, Any],
    *,
    attackers: int,
    crafted: int,
    tokens_per_day: int,
    require_tokens: bool,
    target: int,
    rng: np.random.Generator,
) -> tuple[Any, dict[str, int]]:
    """Run a collector (and an issuer with tokens), let ``attackers`` installs send ``crafted`` reports in
    uploads of ``max_reports_per_day`` each (upload ``j`` from install ``j mod k``, with its next unspent token
    while it has one), and return the accumulator of what the collector published, and its answers."""
    import httpx

    from client_sdk.upload.uploader import FRAME_CONTENT_TYPE
    from collector.http.app import create_app
    from collector.settings import CollectorSettings
    from ldp_core.days import utc_day
    from ldp_core.tokens.privacy_pass import authorization_header
    from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame
    from pipeline.topics import RAW_TOPIC
    from pipeline.transport import open_transport
    from simulator.stack import serve_in_thread
    from simulator.token_fleet import LocalIssuer

    workdir.mkdir(parents=True, exist_ok=True)
    metrics_path = workdir / "metrics.json"
    metrics_path.write_text(json.dumps(doc))
    r = int(doc["metrics"]["poisoned"]["max_reports_per_day"])
    issuer = LocalIssuer(workdir / "issuer", tokens_per_day=tokens_per_day).start() if require_tokens else None
    options = issuer.collector_options(workdir / "spent.sqlite3") if issuer is not None else {}
    settings = CollectorSettings(
        metrics_path=str(metrics_path),
        transport_url=f"sqlite:///{workdir / 'log.sqlite3'}",
        dedup_path=str(workdir / "ids.sqlite3"),
        raw_partitions=1,
        **options,
    )
    transport = open_transport(settings.transport_url)
    outcomes: collections.Counter[str] = collections.Counter()
    server = None
    try:
        server, url, _ = serve_in_thread(create_app(settings, transport=transport))
        wallets: list[list[Any]] = [[] for _ in range(attackers)]
        if issuer is not None:
            for i in range(attackers):
                wallets[i] = issuer.client(issuer.enroll(f"attacker-{i}")).fetch(tokens_per_day)
        day = utc_day(time.time())
        with httpx.Client(base_url=url, timeout=60.0) as http:
            for j in range(math.ceil(crafted / r)):
                n = min(r, crafted - j * r)
                batch = ReportBatch("poisoned", spec, day, crafted_reports(spec, target, n, rng), rng.bytes(16))
                headers = {"Content-Type": FRAME_CONTENT_TYPE, "Idempotency-Key": batch.batch_id.hex()}
                wallet = wallets[j % attackers]
                if wallet:
                    headers["Authorization"] = authorization_header(wallet.pop())
                resp = http.post("/v1/reports", content=encode_frame(batch), headers=headers)
                reason = "accepted" if resp.status_code == 202 else str(resp.json().get("error", "?"))
                outcomes[f"{resp.status_code} {reason}"] += 1
        got = accumulator_for(spec)
        with transport.consume(RAW_TOPIC, f"reader-{uuid.uuid4().hex[:8]}", session_timeout=2.0) as c:
            while recs := c.poll(max_records=1000, timeout=0.3):
                for rec in recs:
                    got.update(decode_frame(rec.value, spec))
    finally:
        if server is not None:
            server.should_exit = True
        if issuer is not None:
            issuer.stop()
        transport.close()
    return got, dict(sorted(outcomes.items()))


def token_attack_run(
    mechanism: str,
    epsilon: float,
    domain: int,
    users: int,
    crafted: int,
    attackers: Sequence[int],
    tokens_per_day: int,
    rng: np.random.Generator,
    *,
    require_tokens: bool = True,
    reports_per_day: int = 1,
    target: int | None = None,
    distribution: str = "zipf",
    confidence: float = 0.95,
    workdir: str | Path | None = None,
) -> list[TokenAttackResult]:
    """The attack of :func:`poisoning_run` with ``crafted`` reports, sent through a real collector by ``k``
    enrolled installs for each ``k`` in ``attackers`` (module docstring).

    The honest users' reports are drawn exactly as :func:`poisoning_run` draws them (same ``rng`` sequence:
    the same honest estimate for the same seed) and kept in memory: each would pay with its own token, and
    signing 10⁵ tokens in Python takes minutes. Only the crafted reports go through the collector; what it
    publishes is added to the honest accumulator. ``require_tokens=False`` is the control: the same collector
    without ``--require-tokens``."""
    spec = frequency_spec(make_spec(mechanism, epsilon=epsilon, domain_size=domain))
    t = domain // 2 if target is None else int(target)
    doc = _metrics_doc(mechanism, epsilon, domain, reports_per_day)
    from ldp_core.metrics import parse_metrics

    if parse_metrics(doc, reject_expired=False)["poisoned"].spec.spec_id != spec.spec_id:
        raise ValueError("the metrics file's spec differs from the simulation's")
    values = Distribution(distribution, domain).sample(users, rng)
    honest = accumulator_for(spec)
    honest.update(spec.encode(values, rng))
    h = honest.estimate(confidence)
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="ldp-poisoning-"))
    out = []
    for k in attackers:
        got, outcomes = _attack_collector(
            base / f"k{k}-{'tokens' if require_tokens else 'open'}",
            spec,
            doc,
            attackers=int(k),
            crafted=crafted,
            tokens_per_day=tokens_per_day,
            require_tokens=require_tokens,
            target=t,
            rng=rng,
        )
        acc = accumulator_for(spec)
        acc.merge(honest)
        acc.merge(got)
        e = acc.estimate(confidence)
        out.append(
            TokenAttackResult(
                mechanism=mechanism,
                epsilon=float(epsilon),
                domain=domain,
                users=users,
                require_tokens=require_tokens,
                attackers=int(k),
                tokens_per_day=tokens_per_day,
                reports_per_upload=reports_per_day,
                crafted=crafted,
                accepted=int(got.n),
                outcomes=outcomes,
                target=t,
                true_count=int(np.count_nonzero(values == t)),
                influence=influence(spec),
                honest_estimate=float(h.counts[t]),
                honest_ci=(float(h.ci_low[t]), float(h.ci_high[t])),
                poisoned_estimate=float(e.counts[t]),
                poisoned_ci=(float(e.ci_low[t]), float(e.ci_high[t])),
            )
        )
    return out


def _plot(rows: list[PoisoningResult], path: str) -> None:
    """Left: the target's estimate with its 95% CI (mechanisms whose scale fits one axis); right: the shift in
    honest standard errors, every mechanism."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    mechs = list(dict.fromkeys(r.mechanism for r in rows))
    for mech in mechs:
        rs = [r for r in rows if r.mechanism == mech]
        m = np.array([r.crafted for r in rs])
        se = (rs[0].honest_ci[1] - rs[0].honest_ci[0]) / (2 * 1.959963984540054)
        shift_se = np.array([r.shift for r in rs]) / se
        (line,) = right.plot(m[1:], shift_se[1:], marker="o", label=f"{mech} (Δ = {rs[0].influence:.1f}/report)")
        if rs[0].influence < 50:  # GRR over a large domain would flatten the others
            est = np.array([r.poisoned_estimate for r in rs])
            lo = np.array([r.poisoned_ci[0] for r in rs])
            hi = np.array([r.poisoned_ci[1] for r in rs])
            left.plot(m, est, marker="o", color=line.get_color(), label=mech)
            left.fill_between(m, lo, hi, color=line.get_color(), alpha=0.2)
    r0 = rows[0]
    left.axhline(r0.true_count, color="k", ls="--", lw=1, label=f"true count ({r0.true_count})")
    left.set_xlabel("crafted reports for the target item")
    left.set_ylabel("target's estimated count (95% CI shaded)")
    left.legend(fontsize=8)
    right.axhline(1.96, color="k", ls=":", lw=1, label="1.96 standard errors")
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("crafted reports for the target item")
    right.set_ylabel("shift of the estimate (honest std. errors)")
    right.legend(fontsize=8)
    fig.suptitle(f"Poisoning an LDP frequency estimate: {r0.users:,} honest users, ε = {r0.epsilon:g}, d = {r0.domain}")
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=120)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator.scenarios.ldp.poisoning", description=__doc__.split("\n")[0])
    ap.add_argument("--mechanisms", default="olh,oue,grr")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--domain", type=int, default=1024)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--crafted", default="0,100,500,1000,2000")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--plot", default=None, help="write the plot here (PNG)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--attackers",
        default=None,
        help="comma-separated installs k: send the largest --crafted count through a real collector that "
        "requires tokens (and once through one that does not), for each k",
    )
    ap.add_argument("--tokens-per-day", type=int, default=8, help="with --attackers: the issuer's K (default 8)")
    args = ap.parse_args(argv)
    crafted = [int(x) for x in args.crafted.split(",")]
    if args.attackers is not None:
        return _main_tokens(args, crafted)
    rows: list[PoisoningResult] = []
    for mech in args.mechanisms.split(","):
        rng = np.random.default_rng(args.seed)
        rows += poisoning_run(mech, args.epsilon, args.domain, args.users, crafted, rng)
    if args.json:
        json.dump([r.to_dict() for r in rows], sys.stdout, indent=1)
        print()
    else:
        print("| mechanism | crafted | Δ per report | estimate (95% CI) | shift | m·Δ |")
        print("|---|---:|---:|---|---:|---:|")
        for r in rows:
            print(
                f"| {r.mechanism} | {r.crafted:,} | {r.influence:.2f} | {r.poisoned_estimate:,.0f} "
                f"({r.poisoned_ci[0]:,.0f} .. {r.poisoned_ci[1]:,.0f}) | {r.shift:,.0f} | {r.predicted_shift:,.0f} |"
            )
        print(f"true count of the target: {rows[0].true_count}")
    if args.plot:
        _plot(rows, args.plot)
    return 0


def _main_tokens(args: argparse.Namespace, crafted: list[int]) -> int:
    ks = [int(x) for x in args.attackers.split(",")]
    m = max(crafted)
    rows: list[TokenAttackResult] = []
    for mech in args.mechanisms.split(","):
        for required, attackers in ((False, [1]), (True, ks)):
            rng = np.random.default_rng(args.seed)  # the same honest reports as the table without tokens
            rows += token_attack_run(
                mech, args.epsilon, args.domain, args.users, m, attackers, args.tokens_per_day, rng,
                require_tokens=required,
            )  # fmt: skip
    if args.json:
        json.dump([r.to_dict() for r in rows], sys.stdout, indent=1)
        print()
        return 0
    print("| mechanism | collector | installs k | crafted | accepted | estimate (95% CI) | shift | bound k·K·r·Δ |")
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for r in rows:
        mode = f"tokens, K = {r.tokens_per_day}" if r.require_tokens else "no tokens"
        bound = f"{r.bound:,.0f}" if r.bound is not None else "none"
        print(
            f"| {r.mechanism} | {mode} | {r.attackers:,} | {r.crafted:,} | {r.accepted:,} | "
            f"{r.poisoned_estimate:,.0f} ({r.poisoned_ci[0]:,.0f} .. {r.poisoned_ci[1]:,.0f}) | {r.shift:,.0f} | "
            f"{bound} |"
        )
    r0 = rows[0]
    print(
        f"true count of the target: {r0.true_count}; honest estimate {r0.honest_estimate:,.0f} "
        f"({r0.honest_ci[0]:,.0f} .. {r0.honest_ci[1]:,.0f}); Δ = {r0.influence:.2f} per report, r = "
        f"{r0.reports_per_upload} report per upload"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
