"""The collector's combine step: fetch both aggregators' aggregate shares of one batch and unshard them.

The two shares must cover the same reports (the same count and the same checksum of report ids): if
they do not, one aggregator accepted a report the other refused (a deviating helper, or leader) and the
result would be wrong, so nothing is released (:class:`CollectionRejected`). Each share alone is a
uniformly random vector; only the two together give the aggregate.

When the aggregators add central-DP noise (each to its own share, :mod:`ldp_core.prio3.noise`), the
sum is the aggregate plus both noises and may be negative: it is read as signed integers, and the
result says which noise each share carried and the standard deviation of their sum.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ldp_core.metrics import MetricSet

__all__ = ["CollectionRejected", "Prio3Result", "collect", "unshard"]


class CollectionRejected(RuntimeError):
    """The two aggregate shares do not fit together, or an aggregator refused to release its share."""


@dataclasses.dataclass(frozen=True)
class Prio3Result:
    metric: str
    day: int
    reports: int
    value: int | list[int]
    #: the central-DP noise of each share (``{"leader": ..., "helper": ..., "std": ...}``), None: exact
    noise: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unshard(metrics: MetricSet, metric: str, day: int, shares: list[dict[str, Any]]) -> Prio3Result:
    """Combine the leader's and the helper's released shares (as ``/v1/prio3/collect`` answers them)."""
    leader, helper = shares
    if leader["reports"] != helper["reports"] or leader["checksum"] != helper["checksum"]:
        raise CollectionRejected(
            f"the aggregators' shares of {metric}/{day} cover different reports (leader {leader['reports']}, "
            f"helper {helper['reports']}, checksums {'equal' if leader['checksum'] == helper['checksum'] else 'differ'}): "
            "an aggregator deviated; the aggregate is not released"
        )
    config = metrics.prio3[metric].config
    vdaf = config.vdaf()
    raw = [bytes.fromhex(s["aggregate_share"]) for s in shares]
    noises = [s.get("noise") for s in shares]
    if not any(noises):
        value = vdaf.unshard(raw, int(leader["reports"]))
        return Prio3Result(
            metric, day, int(leader["reports"]), value if isinstance(value, int) else [int(v) for v in value]
        )
    signed = [int(v) for v in vdaf.unshard_signed(raw)]
    variance = sum(float(n["variance"]) for n in noises if n)
    noise = {"leader": noises[0], "helper": noises[1], "variance": variance, "std": variance**0.5}
    out: int | list[int] = signed if config.type in ("histogram", "sumvec") else signed[0]
    return Prio3Result(metric, day, int(leader["reports"]), out, noise)


def collect(
    metrics: MetricSet, metric: str, day: int, leader_url: str, helper_url: str, *, token: str | None = None
) -> Prio3Result:
    """Ask both aggregators for their share of batch ``metric``/``day`` over HTTP and unshard."""
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else {}
    shares = []
    for url in (leader_url, helper_url):
        resp = httpx.post(
            url.rstrip("/") + "/v1/prio3/collect", json={"metric": metric, "day": day}, headers=headers, timeout=60
        )
        if resp.status_code != 200:
            raise CollectionRejected(f"{url} refused to release its share of {metric}/{day}: {resp.text[:300]}")
        shares.append(resp.json())
    return unshard(metrics, metric, day, shares)
