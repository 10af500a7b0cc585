"""The declarative metrics file and the local policy's check of metric definitions."""

from __future__ import annotations

import copy
import datetime
import json
import pathlib

import pytest

from client_sdk.policy import LocalPolicy, to_units
from ldp_core.domain import Dictionary, HashedDomain
from ldp_core.errors import BudgetError
from ldp_core.mechanisms.grr import GRRSpec
from ldp_core.metrics import FORMAT, MetricsFileError, load_metrics, parse_metrics

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "metrics" / "example.json"
DAY_2030_06_01 = (datetime.date(2030, 6, 1) - datetime.date(1970, 1, 1)).days

BASE = {
    "format": FORMAT,
    "metrics": {
        "tab": {
            "description": "Which tab was opened",
            "owner": "team@example.org",
            "expires": "2030-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["a", "b", "c"], "other": True},
            "max_reports_per_day": 2,
        }
    },
}


def doc_with(**changes: object) -> dict:
    doc = copy.deepcopy(BASE)
    for key, val in changes.items():
        if val is None:
            del doc["metrics"]["tab"][key]
        else:
            doc["metrics"]["tab"][key] = val
    return doc


def test_example_file_loads_and_round_trips() -> None:
    ms = load_metrics(EXAMPLE, today=DAY_2030_06_01)
    assert {"emoji_used", "settings_tab", "dark_mode", "search_word"} <= set(ms)
    again = parse_metrics(ms.to_json(), today=DAY_2030_06_01)
    assert {n: m.spec.spec_id for n, m in again.items()} == {n: m.spec.spec_id for n, m in ms.items()}
    assert again.to_dict() == ms.to_dict()


def test_fields_are_parsed() -> None:
    m = parse_metrics(BASE, today=0)["tab"]
    assert m.spec == GRRSpec(epsilon=1.0, domain_size=4)  # domain_size filled from the domain (3 values + other)
    assert m.domain == Dictionary(("a", "b", "c"), other=True)
    assert m.max_reports_per_day == 2 and m.daily_epsilon == 2.0
    assert m.expires_day == DAY_2030_06_01 + 213  # June 1 -> Dec 31 is 213 days
    assert not m.is_expired(m.expires_day) and m.is_expired(m.expires_day + 1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"owner": None}, r"missing field\(s\) \['owner'\]"),
        ({"colour": "red"}, r"unknown field\(s\) \['colour'\]"),
        ({"expires": "next year"}, "ISO date"),
        ({"max_reports_per_day": 0}, "max_reports_per_day"),
        ({"max_reports_per_day": 2.0}, "max_reports_per_day"),
        ({"description": "  "}, "description"),
        ({"mechanism": {"mechanism": "grr", "epsilon": -1}}, "epsilon"),
        ({"mechanism": {"mechanism": "nope", "epsilon": 1}}, "unknown mechanism"),
        ({"mechanism": {"mechanism": "grr", "epsilon": 1, "domain_size": 9}}, "differs from the domain's size 4"),
        ({"domain": {"kind": "list"}}, "bad 'domain'"),
    ],
)
def test_invalid_metrics_are_refused_with_the_field_named(changes: dict, message: str) -> None:
    with pytest.raises(MetricsFileError, match=message) as info:
        parse_metrics(doc_with(**changes), today=0)
    assert "'tab'" in str(info.value) or "tab" in str(info.value)


def test_document_level_errors() -> None:
    with pytest.raises(MetricsFileError, match="format"):
        parse_metrics({"format": "v0", "metrics": {}})
    with pytest.raises(MetricsFileError, match="not valid JSON"):
        parse_metrics("{")
    dup = '{"format": "ldp-metrics/1", "metrics": {"a": {}, "a": {}}}'
    with pytest.raises(MetricsFileError, match="appears twice"):
        parse_metrics(dup)
    with pytest.raises(MetricsFileError, match="name"):
        parse_metrics({"format": FORMAT, "metrics": {"bad name!": BASE["metrics"]["tab"]}}, today=0)
    with pytest.raises(MetricsFileError, match="cannot read"):
        load_metrics("/nonexistent/metrics.json")


def test_expired_metrics_are_refused_unless_asked_not_to() -> None:
    late = DAY_2030_06_01 + 214  # 2031-01-01
    with pytest.raises(MetricsFileError, match="expired on 2030-12-31"):
        parse_metrics(BASE, today=late)
    ms = parse_metrics(json.dumps(BASE), today=late, reject_expired=False)
    assert ms.expired(late) == ["tab"]


def test_hashed_domain_metric() -> None:
    doc = doc_with(domain={"kind": "hashed", "size": 64, "seed": 3})
    m = parse_metrics(doc, today=0)["tab"]
    assert m.domain == HashedDomain(64, 3) and m.spec.domain_size == 64


# -- policy ----------------------------------------------------------------------


def test_policy_validation() -> None:
    for bad in (0, -1, float("inf"), float("nan"), "1", True):
        with pytest.raises(BudgetError):
            LocalPolicy(per_metric_daily=bad, total_daily=1.0)  # type: ignore[arg-type]
    with pytest.raises(BudgetError):
        LocalPolicy(per_metric_daily=1.0, total_daily=2.0, per_metric_overrides={"x": 0})
    p = LocalPolicy(per_metric_daily=1.0, total_daily=2.0, per_metric_overrides={"x": 5.0, "y": 0.5})
    assert p.metric_cap("x") == 2.0  # never above the total
    assert p.metric_cap("y") == 0.5 and p.metric_cap("z") == 1.0
    with pytest.raises(TypeError):
        p.per_metric_overrides["z"] = 1.0  # type: ignore[index]


def test_policy_refuses_metrics_whose_daily_demand_exceeds_a_cap() -> None:
    m = parse_metrics(BASE, today=0)["tab"]  # 2 reports x epsilon 1 = 2 per day
    LocalPolicy(per_metric_daily=2.0, total_daily=2.0).check_metric(m)
    with pytest.raises(BudgetError, match=r"'tab'.*2 report\(s\) of epsilon 1 per day \(2 in all\).*cap of 1.5"):
        LocalPolicy(per_metric_daily=1.5, total_daily=5.0).check_metric(m)
    with pytest.raises(BudgetError):
        LocalPolicy(per_metric_daily=5.0, total_daily=1.9).check_metric(m)
    with pytest.raises(BudgetError):
        LocalPolicy(per_metric_daily=5.0, total_daily=5.0, per_metric_overrides={"tab": 1.0}).check_metric(m)


def test_epsilon_units_are_exact_and_conservative() -> None:
    assert to_units(0.1, round_up=True) * 10 == to_units(1.0, round_up=False)
    assert to_units(1 / 3, round_up=True) == 333_333_334
    assert to_units(1 / 3, round_up=False) == 333_333_333
