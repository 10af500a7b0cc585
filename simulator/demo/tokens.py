"""The demo's ``--tokens`` run (docs/TOKENS.md): the token issuer beside a collector that requires a token per
upload, the SDK devices' enrollment, one install that floods a metric beyond its allowance, and the tally of
tokens issued, spent and refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["start_issuer", "sdk_token_options", "flood_metric", "token_summary"]


def start_issuer(workdir: Path, tokens_per_day: int | None, names: list[str], metrics_path: Path) -> Any:
    """A started :class:`~simulator.token_fleet.LocalIssuer` in ``workdir``/issuer with K = ``tokens_per_day``
    (default: one per metric); ValueError, before anything starts, if K is below one upload per metric."""
    from simulator.token_fleet import LocalIssuer

    k = len(names) if tokens_per_day is None else tokens_per_day
    if k < len(names):
        raise ValueError(
            f"--tokens-per-day {k} is too few: each device uploads once per metric, so K must be at least "
            f"{len(names)} (the metrics in {metrics_path})"
        )
    return LocalIssuer(Path(workdir) / "issuer", tokens_per_day=k).start()


def sdk_token_options(issuer: Any, token_origin: str) -> Callable[[int, Path], dict[str, Any]]:
    """The SDK devices' client options under ``--tokens``: device ``i`` enrolls with the issuer (its bundle
    beside its folder) and fetches its K tokens for ``token_origin``."""

    def client_options(i: int, folder: Path) -> dict[str, Any]:
        bundle = folder.with_name(folder.name + "-enrollment.json")
        bundle.parent.mkdir(parents=True, exist_ok=True)
        issuer.enroll(f"sdk-device-{i}").save(bundle)
        return {
            "issuer_url": issuer.url,
            "enrollment_path": bundle,
            "token_origin": token_origin,
            "token_stock": issuer.tokens_per_day,
        }

    return client_options


def flood_metric(url: str, issuer: Any, metrics: Any, names: list[str], day: int, attempts: int, rng: Any) -> Any:
    """One install floods the first metric with a crafting rule (docs/PRIVACY.md §6); ``None`` if none has."""
    from simulator.crafted import CRAFTABLE
    from simulator.token_fleet import flood

    target = next((n for n in names if metrics[n].kind == "frequency" and metrics[n].spec.name in CRAFTABLE), None)
    if target is None:
        print("  flood: no metric here has a crafting rule (grr, oue, olh); skipped")
        return None
    res = flood(url, issuer, metrics, target, day, attempts, rng)
    refused = ", ".join(f"{k}: {n:,}" for k, n in res.outcomes.items() if not k.startswith("202"))
    print(
        f"  flood: one install sent {attempts + 1:,} uploads of crafted {target} reports for item {res.target}: "
        f"{res.accepted:,} accepted (its {res.tokens} tokens x {res.reports_per_upload} report"
        f"{'s' if res.reports_per_upload > 1 else ''}), {res.refused:,} refused ({refused}); "
        f"the issuer refused it more tokens ({', '.join(f'{k}: {n}' for k, n in res.issuer_refusals.items())})",
        flush=True,
    )
    return res


def token_summary(
    issuer: Any,
    spent_path: str,
    expected: dict[str, int],
    flooded: Any,
    live: dict[str, Any],
    metrics: Any,
    truth: Any,
) -> tuple[dict[str, Any], bool]:
    """Print the issued/spent/refused counts; the demo.json entry and whether the counts add up: every upload
    spent one token and the flood got no more than its K."""
    from collector.spent_tokens import SpentTokens

    issued = issuer.issued()
    store = SpentTokens(spent_path)  # the collector's own record of redeemed tokens
    try:
        spent = len(store)
    finally:
        store.close()
    honest = sum(expected.values()) - (flooded.accepted_reports if flooded is not None else 0)
    flood_spent = flooded.accepted if flooded is not None else 0
    refused = flooded.refused if flooded is not None else 0
    print(
        f"tokens: {issued:,} issued, {spent:,} spent ({honest:,} by the fleet, one per upload of one report; "
        f"{flood_spent:,} by the flooder), {refused:,} uploads refused"
    )
    out: dict[str, Any] = {"issued": issued, "spent": spent, "refused": refused, "flood": None}
    ok = spent <= issued and spent == honest + flood_spent
    if flooded is not None:
        from ldp_core.mechanisms import frequency_spec
        from simulator.crafted import influence

        spec = frequency_spec(metrics[flooded.metric].spec)
        est = live[flooded.metric]
        t = flooded.target
        bound = flooded.tokens * flooded.reports_per_upload * influence(spec)
        got = est["counts"][t]
        print(
            f"  flooded item {t} of {flooded.metric}: true count {int(truth[flooded.metric][t]):,}, estimate "
            f"{got:,.0f} (95% CI {est['ci_low'][t]:,.0f}..{est['ci_high'][t]:,.0f}); the flood can add at most "
            f"K x max_reports_per_day x Δ = {flooded.tokens} x {flooded.reports_per_upload} x "
            f"{influence(spec):.2f} = {bound:,.1f}"
        )
        ok &= flooded.accepted <= issuer.tokens_per_day
        out["flood"] = {**flooded.to_dict(), "estimate": got, "bound": bound}
    return out, ok
