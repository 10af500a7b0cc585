"""Declarative metric definitions, shared by the SDK and the collector.

A metrics file is JSON (readable by the standard library on every device;
YAML would need a dependency). It is the same document the collector serves
at ``GET /v1/metrics``::

    {
      "format": "ldp-metrics/1",
      "metrics": {
        "emoji_used": {
          "description": "Which emoji a user sent",
          "owner": "messaging-team@example.org",
          "expires": "2027-12-31",
          "mechanism": {"mechanism": "olh", "epsilon": 1.0},
          "domain": {"kind": "hashed", "size": 1024, "seed": 0},
          "max_reports_per_day": 1
        }
      }
    }

Every field of a metric is required but ``kind``. ``mechanism`` is a spec
dict for :func:`ldp_core.mechanisms.spec_from_dict`; its ``domain_size``
may be left out and is then the domain's size, and when given it must equal
it. ``domain`` is a dict for :func:`ldp_core.domain.domain_from_dict`.

**Heavy-hitter metrics** (docs/HEAVY_HITTERS.md) have a ``string`` domain
``{"kind": "string", "length": 16, "overflow": "truncate"}`` and a ``pem`` or
``sfp`` mechanism (``"kind": "heavy_hitters"``); the mechanism's ``length``
and ``overflow`` may be left out and are then the domain's.

**Numeric metrics** (docs/NUMERIC.md) have a ``range`` domain and a numeric
mechanism, and may say what they estimate in ``kind``::

    "session_minutes": {
      "kind": "mean",
      "mechanism": {"mechanism": "auto", "epsilon": 1.0},
      "domain": {"kind": "range", "low": 0, "high": 240, "out_of_range": "clamp"},
      ...
    }

``kind`` is ``frequency`` (the default), ``mean`` or ``distribution`` and
must be what the mechanism estimates. The mechanism's ``low`` and ``high``
may be left out and are then the range's (when given they must equal it);
``"mechanism": "auto"`` (means only) picks the mechanism with the lowest
worst-case variance at the metric's ε
(:func:`ldp_core.mechanisms.numeric.best_mean_mechanism`), once, when the
file is read, so the spec and its id are fixed.

A metric may also set ``sealed`` (default ``false``): a sealed metric's
records are encrypted on the device to the analyzer key that the
document's top-level ``analyzer_keys`` names first (``[{"key_id",
"public_key"}, ...]``; later entries are retired keys, still accepted while
devices move on), see :mod:`ldp_core.wire.sealing` and ``docs/SEALED.md``.
``expires`` is the last UTC day (ISO date, inclusive) on which the metric may
be recorded: like Glean's ``expires``, it forces an owner to renew each
collection deliberately. ``max_reports_per_day`` (r) caps the reports one
device sends for the metric per UTC day (report sampling); a metric's daily
privacy demand is therefore ``r * epsilon``.

**Prio3 metrics** (docs/PRIO3.md) are declared ``"kind": "prio3"`` with a ``prio3`` configuration
(``{"type": "count" | "sum" | "histogram" | "sumvec", ...}``) instead of ``mechanism`` and ``domain``:
their reports are secret shares for two aggregators, whose public keys the document's top-level
``prio3_aggregators`` names (``{"leader": {"key_id", "public_key"}, "helper": {...}}``). They are kept
apart (:attr:`MetricSet.prio3`): iterating a :class:`MetricSet` gives the LDP metrics only. Unknown keys, duplicate names
and malformed fields are errors that name the metric and the field.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from ldp_core.days import EPOCH, utc_day
from ldp_core.domain import Domain, NumberRange, StringDomain, domain_from_dict
from ldp_core.errors import SpecError
from ldp_core.mechanisms import ReportSpec, spec_class, spec_from_dict
from ldp_core.prio3.report import ROLES, Prio3Metric, Prio3Spec
from ldp_core.wire.sealing import AnalyzerPublicKey, SealedSpec, SealingError

__all__ = [
    "FORMAT",
    "MetricsFileError",
    "MetricDefinition",
    "MetricSet",
    "parse_metrics",
    "load_metrics",
    "MAX_REPORTS_PER_DAY",
]

FORMAT = "ldp-metrics/1"
MAX_REPORTS_PER_DAY = 10_000
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")
_FIELDS = ("description", "owner", "expires", "mechanism", "domain", "max_reports_per_day")
_OPTIONAL = ("kind", "sealed")
KINDS = ("frequency", "mean", "distribution", "heavy_hitters")


class MetricsFileError(SpecError):
    """A metrics file (or one metric in it) is invalid; the message names the metric and field."""


@dataclasses.dataclass(frozen=True)
class MetricDefinition:
    """One declared metric: what is collected, how privately, by whom, until when."""

    name: str
    spec: ReportSpec
    domain: Domain
    owner: str
    description: str
    expires: _dt.date
    max_reports_per_day: int
    sealed: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise MetricsFileError(
                f"metric name {self.name!r} is invalid: use 1-255 characters from letters, digits and _ . : -"
            )
        where = f"metric {self.name!r}"
        for field in ("owner", "description"):
            val = getattr(self, field)
            if not isinstance(val, str) or not val.strip():
                raise MetricsFileError(f"{where}: '{field}' must be a non-empty string")
        if not isinstance(self.expires, _dt.date):
            raise MetricsFileError(f"{where}: 'expires' must be a date")
        r = self.max_reports_per_day
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= MAX_REPORTS_PER_DAY:
            raise MetricsFileError(
                f"{where}: 'max_reports_per_day' must be an integer from 1 to {MAX_REPORTS_PER_DAY}, got {r!r}"
            )
        if not isinstance(self.sealed, bool):
            raise MetricsFileError(f"{where}: 'sealed' must be true or false, got {self.sealed!r}")
        dom = self.domain
        if isinstance(dom, StringDomain) or self.spec.kind == "heavy_hitters":
            if not (isinstance(dom, StringDomain) and self.spec.kind == "heavy_hitters"):
                raise MetricsFileError(
                    f"{where}: a heavy-hitter mechanism (pem, sfp) and a 'string' domain go together; "
                    f"got {self.spec.name} with a {type(dom).__name__}"
                )
            got = (getattr(self.spec, "length", None), getattr(self.spec, "overflow", None))
            if got != (dom.length, dom.overflow):
                raise MetricsFileError(
                    f"{where}: the mechanism's length/overflow {got} differ from the domain's "
                    f"({dom.length}, {dom.overflow!r}); leave them out to use the domain's"
                )
            marker = getattr(self.spec, "end_marker", 0)
            if marker != dom.end_marker:
                raise MetricsFileError(
                    f"{where}: the mechanism's end_marker {marker!r} differs from the domain's "
                    f"{dom.end_marker!r}; leave it out to use the domain's"
                )
            return
        numeric = isinstance(dom, NumberRange)
        if numeric != (self.spec.kind != "frequency"):
            raise MetricsFileError(
                f"{where}: a {self.spec.kind} mechanism ({self.spec.name}) needs "
                + ("a 'range' domain" if self.spec.kind != "frequency" else "a 'dictionary' or 'hashed' domain")
            )
        if isinstance(dom, NumberRange):
            rng = (getattr(self.spec, "low", None), getattr(self.spec, "high", None))
            if rng != (dom.low, dom.high):
                raise MetricsFileError(
                    f"{where}: the mechanism's range [{rng[0]}, {rng[1]}] differs from the domain's "
                    f"[{dom.low}, {dom.high}]; leave low and high out to use the domain's"
                )
        elif getattr(self.spec, "domain_size", None) != dom.size:
            raise MetricsFileError(
                f"{where}: the mechanism's domain_size {getattr(self.spec, 'domain_size', None)} differs from the "
                f"domain's size {self.domain.size}; leave domain_size out to use the domain's"
            )

    @property
    def kind(self) -> str:
        """What the metric estimates: ``frequency``, ``mean`` or ``distribution`` (its mechanism's kind)."""
        return self.spec.kind

    @property
    def wire_spec(self) -> ReportSpec:
        """The spec its frames carry: the :class:`~ldp_core.wire.sealing.SealedSpec` of a sealed metric."""
        return SealedSpec.of(self.spec) if self.sealed else self.spec

    @property
    def expires_day(self) -> int:
        """The last UTC day (days since 1970-01-01) on which the metric may be recorded."""
        return (self.expires - EPOCH).days

    def is_expired(self, day: int) -> bool:
        return day > self.expires_day

    @property
    def epsilon_per_report(self) -> float:
        return self.spec.epsilon

    @property
    def daily_epsilon(self) -> float:
        """The most a device can spend on this metric in one day: ``r * epsilon``."""
        return self.max_reports_per_day * self.spec.epsilon

    def to_dict(self) -> dict[str, Any]:
        kind = {} if self.kind == "frequency" else {"kind": self.kind}
        out = {
            **kind,
            "description": self.description,
            "owner": self.owner,
            "expires": self.expires.isoformat(),
            "mechanism": self.spec.to_dict(),
            "domain": self.domain.to_dict(),
            "max_reports_per_day": self.max_reports_per_day,
        }
        if self.sealed:
            out["sealed"] = True
        return out

    @classmethod
    def from_dict(cls, name: str, data: Any) -> MetricDefinition:
        where = f"metric {name!r}"
        if not isinstance(data, Mapping):
            raise MetricsFileError(f"{where}: the definition must be an object with {list(_FIELDS)}")
        unknown = sorted(set(data) - set(_FIELDS) - set(_OPTIONAL))
        if unknown:
            raise MetricsFileError(
                f"{where}: unknown field(s) {unknown}; the fields are {list(_FIELDS)} and optionally {list(_OPTIONAL)}"
            )
        kind = data.get("kind", None)
        if kind is not None and kind not in KINDS:
            raise MetricsFileError(f"{where}: 'kind' must be one of {list(KINDS)}, got {kind!r}")
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise MetricsFileError(f"{where}: missing field(s) {missing}")
        try:
            expires = _dt.date.fromisoformat(data["expires"]) if isinstance(data["expires"], str) else None
        except ValueError:
            expires = None
        if expires is None:
            raise MetricsFileError(
                f"{where}: 'expires' must be an ISO date such as \"2027-12-31\", got {data['expires']!r}"
            )
        try:
            domain = domain_from_dict(dict(data["domain"]) if isinstance(data["domain"], Mapping) else data["domain"])
        except (SpecError, KeyError, TypeError, ValueError) as exc:
            raise MetricsFileError(f"{where}: bad 'domain': {exc}") from None
        mech = data["mechanism"]
        if not isinstance(mech, Mapping):
            raise MetricsFileError(
                f'{where}: \'mechanism\' must be an object such as {{"mechanism": "grr", "epsilon": 1.0}}'
            )
        mech = dict(mech)
        try:
            if isinstance(domain, StringDomain):
                name_ = mech.get("mechanism")
                if not isinstance(name_, str) or spec_class(name_).kind != "heavy_hitters":
                    raise SpecError(f"a 'string' domain needs a heavy-hitter mechanism (pem or sfp), got {name_!r}")
                mech.setdefault("length", domain.length)
                mech.setdefault("overflow", domain.overflow)
                mech.setdefault("end_marker", domain.end_marker)
            elif isinstance(domain, NumberRange):
                name_ = mech.get("mechanism")
                if name_ != "auto" and isinstance(name_, str) and spec_class(name_).kind == "frequency":
                    raise SpecError(
                        f"a frequency mechanism ({name_}) needs a 'dictionary' or 'hashed' domain, not a range"
                    )
                mech.setdefault("low", domain.low)
                mech.setdefault("high", domain.high)
                if mech.get("mechanism") == "auto":
                    if kind not in (None, "mean"):
                        raise SpecError(f"'auto' picks a mean mechanism, but the metric's kind is {kind!r}")
                    from ldp_core.mechanisms.numeric import best_mean_mechanism

                    eps = mech.get("epsilon")
                    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
                        raise SpecError(f"epsilon must be a number, got {eps!r}")
                    mech["mechanism"] = best_mean_mechanism(float(eps), int(mech.get("dims", 1)), mech.get("sample"))
            else:
                name_ = mech.get("mechanism")
                if name_ == "auto" or (isinstance(name_, str) and spec_class(name_).kind != "frequency"):
                    needs = "a 'string'" if isinstance(name_, str) and name_ in ("pem", "sfp") else "a 'range'"
                    raise SpecError(
                        f"a {spec_class(name_).kind if name_ != 'auto' else 'numeric'} mechanism ({name_}) needs {needs} domain"
                    )
                mech.setdefault("domain_size", domain.size)
            spec = spec_from_dict(mech)
        except SpecError as exc:
            raise MetricsFileError(f"{where}: bad 'mechanism': {exc}") from None
        if isinstance(domain, NumberRange) and getattr(spec, "dims", 1) != domain.dims:
            domain = dataclasses.replace(domain, dims=int(getattr(spec, "dims", 1)))  # values of several attributes
        if kind is not None and kind != spec.kind:
            raise MetricsFileError(f"{where}: 'kind' is {kind!r} but {spec.name} estimates a {spec.kind}")
        return cls(
            name=name,
            spec=spec,
            domain=domain,
            owner=data["owner"],
            description=data["description"],
            expires=expires,
            max_reports_per_day=data["max_reports_per_day"],
            sealed=data.get("sealed", False),
        )


class MetricSet(Mapping[str, MetricDefinition]):
    """An immutable, validated collection of metric definitions keyed by name."""

    def __init__(
        self,
        metrics: Mapping[str, MetricDefinition] | None = None,
        analyzer_keys: tuple[AnalyzerPublicKey, ...] = (),
        *,
        prio3: Mapping[str, Prio3Metric] | None = None,
        prio3_aggregators: Mapping[str, AnalyzerPublicKey] | None = None,
    ) -> None:
        self._metrics: dict[str, MetricDefinition] = dict(metrics or {})
        #: the Prio3 metrics (docs/PRIO3.md), apart from the LDP ones
        self.prio3: dict[str, Prio3Metric] = dict(prio3 or {})
        #: the two aggregators' public keys, by role (Prio3 metrics need both)
        self.prio3_aggregators: dict[str, AnalyzerPublicKey] = dict(prio3_aggregators or {})
        if self.prio3 and set(self.prio3_aggregators) != set(ROLES):
            raise MetricsFileError(
                f"metric(s) {sorted(self.prio3)} are prio3 metrics, but the metrics file's 'prio3_aggregators' "
                "does not name a 'leader' and a 'helper' key (create them with `ldp keys new`)"
            )
        both = sorted(set(self.prio3) & set(self._metrics))
        if both:
            raise MetricsFileError(f"metric(s) {both} are declared twice")
        for name, m in self._metrics.items():
            if m.name != name:
                raise MetricsFileError(f"metric keyed {name!r} is named {m.name!r}")
        #: the analyzer public keys, the current one first (sealed metrics need one)
        self.analyzer_keys = tuple(analyzer_keys)
        sealed = sorted(n for n, m in self._metrics.items() if m.sealed)
        if sealed and not self.analyzer_keys:
            raise MetricsFileError(
                f"metric(s) {sealed} are sealed, but the metrics file names no 'analyzer_keys'; "
                "create a key pair with `ldp keys new` and add its public entry"
            )

    def prio3_spec(self, name: str) -> Prio3Spec:
        """The wire spec of Prio3 metric ``name`` (it binds both aggregators' key ids)."""
        return self.prio3[name].wire_spec(self.prio3_aggregators["leader"], self.prio3_aggregators["helper"])

    @property
    def analyzer_key(self) -> AnalyzerPublicKey | None:
        """The key devices seal to now (the first of :attr:`analyzer_keys`)."""
        return self.analyzer_keys[0] if self.analyzer_keys else None

    def __getitem__(self, name: str) -> MetricDefinition:
        return self._metrics[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def __len__(self) -> int:
        return len(self._metrics)

    def expired(self, day: int) -> list[str]:
        """Names of the metrics that may no longer be recorded on ``day``."""
        return [n for n, m in self._metrics.items() if m.is_expired(day)]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": FORMAT, "metrics": {n: m.to_dict() for n, m in self._metrics.items()}}
        if self.analyzer_keys:
            out["analyzer_keys"] = [k.to_dict() for k in self.analyzer_keys]
        if self.prio3:
            out["metrics"].update({n: m.to_dict() for n, m in self.prio3.items()})
            out["prio3_aggregators"] = {r: k.to_dict() for r, k in self.prio3_aggregators.items()}
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, ensure_ascii=False)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            raise MetricsFileError(f"key {key!r} appears twice in the same object")
        out[key] = val
    return out


def parse_metrics(
    document: str | bytes | Mapping[str, Any],
    *,
    today: int | None = None,
    reject_expired: bool = True,
) -> MetricSet:
    """Validate a metrics document (JSON text or an already parsed object).

    With ``reject_expired`` (the default, used by linting and the collector) a
    metric whose ``expires`` is before ``today`` (UTC day number; default: the
    current day) is an error. The SDK passes ``reject_expired=False`` and
    stops recording expired metrics instead, so an app never fails to start
    because a date passed.
    """
    if isinstance(document, (str, bytes, bytearray)):
        try:
            obj = json.loads(document, object_pairs_hook=_no_duplicates)
        except MetricsFileError:
            raise
        except ValueError as exc:
            raise MetricsFileError(f"metrics file is not valid JSON: {exc}") from None
    else:
        obj = document
    if not isinstance(obj, Mapping):
        raise MetricsFileError('a metrics file must be a JSON object {"format": ..., "metrics": {...}}')
    if obj.get("format") != FORMAT:
        raise MetricsFileError(f"metrics file format must be {FORMAT!r}, got {obj.get('format')!r}")
    unknown = sorted(set(obj) - {"format", "metrics", "analyzer_keys", "prio3_aggregators"})
    if unknown:
        raise MetricsFileError(f"metrics file: unknown top-level key(s) {unknown}")
    raw = obj.get("metrics")
    if not isinstance(raw, Mapping):
        raise MetricsFileError("metrics file: 'metrics' must be an object keyed by metric name")
    prio3, aggregators = _prio3_part(obj, raw)
    metrics = {name: MetricDefinition.from_dict(name, data) for name, data in raw.items() if name not in prio3}
    keys_raw = obj.get("analyzer_keys", [])
    if not isinstance(keys_raw, list):
        raise MetricsFileError("metrics file: 'analyzer_keys' must be a list, the current key first")
    try:
        keys = tuple(AnalyzerPublicKey.from_dict(k) for k in keys_raw)
    except SealingError as exc:
        raise MetricsFileError(f"metrics file: bad 'analyzer_keys': {exc}") from None
    if len({k.key_id for k in keys}) != len(keys):
        raise MetricsFileError("metrics file: 'analyzer_keys' names a key twice")
    if reject_expired:
        if today is None:
            today = utc_day(_dt.datetime.now(_dt.UTC).timestamp())
        every: list[MetricDefinition | Prio3Metric] = [*metrics.values(), *prio3.values()]
        for m in every:
            if today > m.expires_day:
                raise MetricsFileError(
                    f"metric {m.name!r} expired on {m.expires.isoformat()}; its owner {m.owner} must renew "
                    f"('expires') or remove it"
                )
    return MetricSet(metrics, keys, prio3=prio3, prio3_aggregators=aggregators)


def _prio3_part(obj: Mapping[str, Any], raw: Mapping[str, Any]) -> tuple[dict[str, Prio3Metric], dict[str, Any]]:
    """The document's Prio3 metrics (``"kind": "prio3"``) and its ``prio3_aggregators`` keys."""
    prio3: dict[str, Prio3Metric] = {}
    for name, data in raw.items():
        if isinstance(data, Mapping) and data.get("kind") == "prio3":
            if not isinstance(name, str) or not _NAME_RE.match(name):
                raise MetricsFileError(
                    f"metric name {name!r} is invalid: use 1-255 characters from letters, digits and _ . : -"
                )
            try:
                prio3[name] = Prio3Metric.from_dict(name, data)
            except SpecError as exc:
                raise MetricsFileError(f"metric {name!r}: {exc}") from None
    agg_raw = obj.get("prio3_aggregators", {})
    if not isinstance(agg_raw, Mapping) or not set(agg_raw) <= set(ROLES):
        raise MetricsFileError('metrics file: \'prio3_aggregators\' must be {"leader": {key}, "helper": {key}}')
    try:
        aggregators = {r: AnalyzerPublicKey.from_dict(k) for r, k in agg_raw.items()}
    except SealingError as exc:
        raise MetricsFileError(f"metrics file: bad 'prio3_aggregators': {exc}") from None
    if len(aggregators) == 2 and aggregators["leader"].key_id == aggregators["helper"].key_id:
        raise MetricsFileError("metrics file: the leader and the helper must have different keys")
    return prio3, aggregators


def load_metrics(path: str | os.PathLike[str], *, today: int | None = None, reject_expired: bool = True) -> MetricSet:
    """Read and validate a metrics file (see :func:`parse_metrics`)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise MetricsFileError(f"cannot read metrics file {os.fspath(path)!r}: {exc}") from None
    return parse_metrics(data, today=today, reject_expired=reject_expired)
