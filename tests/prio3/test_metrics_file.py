"""Prio3 metrics in the metrics file: parsed apart from the LDP metrics, checked, and written back."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest

from ldp_core.metrics import MetricsFileError, parse_metrics
from ldp_core.wire.sealing import AnalyzerKey

LEADER, HELPER = AnalyzerKey(os.urandom(32)), AnalyzerKey(os.urandom(32))
DOC: dict[str, Any] = {
    "format": "ldp-metrics/1",
    "metrics": {
        "ldp.color": {
            "description": "d",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": ["a", "b"]},
            "max_reports_per_day": 1,
        },
        "p.sum": {
            "kind": "prio3",
            "description": "d",
            "owner": "o@example.org",
            "expires": "2099-12-31",
            "prio3": {"type": "sum", "max_measurement": 10},
            "max_reports_per_day": 2,
        },
    },
    "prio3_aggregators": {"leader": LEADER.public.to_dict(), "helper": HELPER.public.to_dict()},
}


def test_prio3_metrics_are_kept_apart_and_round_trip() -> None:
    ms = parse_metrics(DOC)
    assert list(ms) == ["ldp.color"] and list(ms.prio3) == ["p.sum"]
    spec = ms.prio3_spec("p.sum")
    assert (spec.type, spec.max_measurement, spec.leader_key_id) == ("sum", 10, LEADER.key_id)
    again = parse_metrics(json.dumps(ms.to_dict()))
    assert again.to_dict() == ms.to_dict() and again.prio3_spec("p.sum").spec_id == spec.spec_id


def _bad(mutate: Any) -> str:
    doc = copy.deepcopy(DOC)
    mutate(doc)
    with pytest.raises(MetricsFileError) as err:
        parse_metrics(doc)
    return str(err.value)


def test_bad_prio3_declarations_are_refused_with_a_reason() -> None:
    assert "prio3_aggregators" in _bad(lambda d: d.pop("prio3_aggregators"))
    assert "different keys" in _bad(lambda d: d["prio3_aggregators"].update(helper=d["prio3_aggregators"]["leader"]))
    assert "'p.sum'" in _bad(lambda d: d["metrics"]["p.sum"]["prio3"].update(type="median"))
    assert "max_measurement" in _bad(lambda d: d["metrics"]["p.sum"]["prio3"].update(max_measurement=0))
    assert "unknown" in _bad(lambda d: d["metrics"]["p.sum"].update(mechanism={}))
    assert "expired" in _bad(lambda d: d["metrics"]["p.sum"].update(expires="2001-01-01"))
