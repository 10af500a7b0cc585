"""What a served metrics document may not change about sealing (docs/SEALED.md, "Pinned keys and sealing").

The collector serves ``GET /v1/metrics``; an active collector could serve its own analyzer key (and open
every sealed record) or a definition without ``"sealed": true`` (and read the records in plain). The app's
bundled metrics file is the trust anchor, like a memoized metric's pinned definition:

* the analyzer keys the bundled file names are the only keys records are sealed to. The served current key
  is used if the bundle names it (so the analyzer can rotate to a key the app already ships); any other
  served key is refused (``analyzer_key_refused``, logged once) and the bundled current key is used;
* a served definition that drops sealing from a metric the bundle declares sealed is refused
  (``unsealing_refused`` and ``metric_refused``): the metric is not reported until a sealed definition is
  served again;
* a metric once sealed (bundled sealed, or sealed by a served definition since start) has its queued records
  sealed at upload even if its definition in effect is now plain or refused.

An app whose bundled file names no key gets no pin: a metric only the collector declares sealed is sealed
to the key the collector serves (docs/PRIVACY.md, threat table).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping

from ldp_core.metrics import MetricDefinition, MetricSet
from ldp_core.wire.sealing import AnalyzerPublicKey

__all__ = ["SealPin"]

_log = logging.getLogger("client_sdk")


class SealPin:
    """The bundled file's analyzer keys and sealed metrics, held against served definitions."""

    def __init__(self, bundled: MetricSet, count: Callable[[str], None]) -> None:
        self._bundled = bundled
        self._count = count
        self._lock = threading.Lock()
        self._refused_keys: set[str] = set()
        #: metrics whose queued records are always sealed
        self._must_seal: set[str] = {n for n, m in bundled.items() if m.sealed}
        self._last: AnalyzerPublicKey | None = bundled.analyzer_key

    @property
    def pinned_keys(self) -> tuple[AnalyzerPublicKey, ...]:
        return self._bundled.analyzer_keys

    def unsealing_refusal(self, served: MetricDefinition) -> str | None:
        """Why ``served`` may not replace the bundled definition (it drops sealing), or None."""
        mine = self._bundled.get(served.name)
        if mine is None or not mine.sealed or served.sealed:
            return None
        return (
            f"metric {served.name!r} is sealed in the app's metrics file and the served definition is not: its "
            "records would reach the collector in plain, so the definition is refused and the metric is not "
            "reported until a sealed definition is served again"
        )

    def key(self, served: MetricSet | None) -> AnalyzerPublicKey | None:
        """The key sealed records go to now: the served current key if the bundle names it, else the
        bundled current key; the served one only when the app bundles no key at all."""
        pinned = self._bundled.analyzer_keys
        offered = served.analyzer_key if served is not None else None
        if offered is None or offered in pinned:
            return offered or self._bundled.analyzer_key
        if not pinned:
            return offered
        with self._lock:
            first = offered.key_id not in self._refused_keys
            self._refused_keys.add(offered.key_id)
        if first:
            self._count("analyzer_key_refused")
            _log.warning(
                "refused the analyzer key %s served by the collector: the app's metrics file does not name it; "
                "records stay sealed to %s (ship a new key in the app before the analyzer rotates to it)",
                offered.key_id,
                pinned[0].key_id,
            )
        return pinned[0]

    def sealing(self, merged: Mapping[str, MetricDefinition], served: MetricSet | None) -> dict[str, AnalyzerPublicKey]:
        """Sealed metrics in effect -> their key; remembers them (and the key) for :meth:`key_for`."""
        to = self.key(served)
        out = {n: to for n, m in merged.items() if m.sealed and to is not None}
        with self._lock:
            self._must_seal.update(out)
            if to is not None and out:
                self._last = to
        return out

    def key_for(self, metric: str) -> AnalyzerPublicKey | None:
        """For a queued batch of a metric with no sealed definition in effect: the key if it must still
        be sealed (it was sealed, or the app declares it sealed), else None."""
        with self._lock:
            return self._last if metric in self._must_seal else None
