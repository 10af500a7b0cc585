"""Reads over the whole estimator group: ask the ``--peer`` members for their states and merge what answers.

An estimator member counts only the partitions the group gave it. With ``--peer`` URLs, every read of the
HTTP API (``GET /v1/estimates/{metric}``, the ``GET /v1/estimates`` listing, hence the dashboard) answers for
the whole group by default: :func:`gather` fetches each peer's ``/v1/state`` in parallel and
:func:`~estimator.service.state.merge_states` sums them with this member's own. A peer that does not answer
within ``timeout`` is left out and named: the answer is then *partial* (``partial: true``,
``missing_peers: [...]``) rather than an error, so a member keeps answering for what is reachable while
another restarts. A partial answer also says which part of the shuffled topic it lacks
(``missing_partitions``, and ``missing_parts``: per partition the offset range no answering member counted or
reads, :func:`~estimator.service.state.missing_parts`): since the shuffler spreads a plain metric-day's batches
over every partition, the missing part of a metric-day is its batches in those ranges. ``merged=false`` keeps
the member's local-only answer.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from estimator.service.state import EstimatorState, Tally, merge_states, missing_parts

__all__ = ["PEER_TIMEOUT", "GroupView", "gather", "gather_json"]

#: seconds a merged read waits for one peer's state before answering without it
PEER_TIMEOUT = 5.0


@dataclasses.dataclass
class GroupView:
    """The merged tally of this member and the peers that answered, and who did not."""

    tally: Tally
    instances: int  # states merged (this member included)
    missing: list[str]  # peers' base URLs that did not answer
    errors: dict[str, str]  # why, per missing peer
    parts: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # offset ranges nobody answering holds

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    @property
    def missing_partitions(self) -> list[int]:
        return sorted({int(p["partition"]) for p in self.parts})

    def marks(self) -> dict[str, object]:
        """The JSON keys every merged answer carries."""
        return {
            "merged_instances": self.instances,
            "partial": self.partial,
            "missing_peers": list(self.missing),
            "missing_partitions": self.missing_partitions,
            "missing_parts": [dict(p) for p in self.parts],
        }


def _fetch(url: str, timeout: float) -> EstimatorState:
    import httpx

    r = httpx.get(url.rstrip("/") + "/v1/state", timeout=timeout)
    r.raise_for_status()
    return EstimatorState.from_json_obj(r.json())


def gather(
    local: Callable[[], EstimatorState],
    peers: Sequence[str],
    *,
    timeout: float = PEER_TIMEOUT,
    fetch: Callable[[str, float], EstimatorState] = _fetch,
) -> GroupView:
    """This member's state merged with every reachable peer's (asked in parallel).

    Raises :class:`~estimator.errors.StateError` if the states that answered do not merge (different
    groups or topics, or overlapping counted ranges).
    """
    states = [local()]
    missing: list[str] = []
    errors: dict[str, str] = {}
    if peers:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(peers))) as pool:
            futures = {url: pool.submit(fetch, url, timeout) for url in peers}
            for url, fut in futures.items():
                try:
                    states.append(fut.result())
                except Exception as exc:  # any failure of one peer: answer without it, and say so
                    missing.append(url)
                    errors[url] = f"{type(exc).__name__}: {exc}"
    parts = missing_parts(states) if missing else []
    return GroupView(merge_states(states), len(states), missing, errors, parts)


def _fetch_json(url: str, timeout: float) -> dict[str, Any]:
    import httpx

    r = httpx.get(url, params={"merged": "false"}, timeout=timeout)
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    return body


def gather_json(
    peers: Sequence[str],
    path: str,
    *,
    timeout: float = PEER_TIMEOUT,
    fetch: Callable[[str, float], dict[str, Any]] = _fetch_json,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every peer's own answer to ``GET path?merged=false`` (asked in parallel): the bodies of those that
    answered within ``timeout``, by base URL, and the base URLs of those that did not."""
    bodies: dict[str, dict[str, Any]] = {}
    missing: list[str] = []
    if peers:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(peers))) as pool:
            futures = {url: pool.submit(fetch, url.rstrip("/") + path, timeout) for url in peers}
            for url, fut in futures.items():
                try:
                    bodies[url] = fut.result()
                except Exception:  # noqa: BLE001 - any failure of one peer: answer without it, and say so
                    missing.append(url)
    return bodies, missing
