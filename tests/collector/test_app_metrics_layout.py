"""``GET /v1/metrics?layout=1``: each metric's spec id and record layout, enough to upload without the SDK."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import numpy as np

from collector.http.app import create_app
from collector.settings import CollectorSettings
from ldp_core.metrics import load_metrics, parse_metrics
from ldp_core.wire.frames import ReportBatch, encode_frame
from tests.support.collector_support import TODAY, MemoryTransport, ServerThread, write_metrics


def _metrics_file(tmp_path: Path) -> Path:
    path = tmp_path / "metrics.json"
    write_metrics(path)
    doc = json.loads(path.read_text())
    doc["metrics"]["page_seen"] = {  # OUE: a record is a byte array
        "description": "page",
        "owner": "d@example.org",
        "expires": "2099-12-31",
        "mechanism": {"mechanism": "oue", "epsilon": 1.0},
        "domain": {"kind": "dictionary", "values": [f"p{i}" for i in range(20)]},
        "max_reports_per_day": 1,
    }
    path.write_text(json.dumps(doc))
    return path


def test_layout_describes_every_metric_and_a_client_can_upload_from_it_alone(tmp_path: Path) -> None:
    path = _metrics_file(tmp_path)
    metrics = load_metrics(path, reject_expired=False)
    transport = MemoryTransport()
    cfg = CollectorSettings(metrics_path=str(path), dedup_path=":memory:", raw_partitions=1)
    rng = np.random.default_rng(5)
    with ServerThread(create_app(cfg, transport=transport)) as srv:
        plain = httpx.get(srv.url + "/v1/metrics")
        served = httpx.get(srv.url + "/v1/metrics", params={"layout": "1"})
        assert served.status_code == 200 and served.headers["etag"] != plain.headers["etag"]
        again = httpx.get(srv.url + "/v1/metrics?layout=1", headers={"if-none-match": served.headers["etag"]})
        assert again.status_code == 304
        doc = served.json()
        sent = []
        for name in ("emoji_used", "settings_tab", "page_seen"):
            entry, spec = doc["metrics"][name], metrics[name].spec
            assert entry["spec_id"] == spec.spec_id and entry["accepted_spec_ids"] == [spec.spec_id]
            assert entry["mechanism"] == spec.to_dict()  # the existing keys are all still there
            fields = entry["record"]["fields"]
            # the record dtype, rebuilt from the layout's numpy type strings and shapes
            rebuilt = np.dtype([(f["name"], f["dtype"], tuple(f.get("shape", ()))) for f in fields])
            assert rebuilt == spec.record_dtype and entry["record"]["itemsize"] == spec.record_dtype.itemsize
            records = spec.encode(rng.integers(0, spec.domain_size, 7), rng)
            rows = [
                [bytes(rec[f["name"]]).hex() if f["json"]["type"] == "string" else int(rec[f["name"]]) for f in fields]
                for rec in records
            ]
            assert entry["record"]["json_record"] == [f["name"] for f in fields]
            batch_id = os.urandom(16)
            body = {
                "version": 1,
                "metric": name,
                "spec_id": entry["spec_id"],
                "day": TODAY,
                "batch_id": batch_id.hex(),
                "records": rows,
            }
            r = httpx.post(srv.url + "/v1/reports", json=body)
            assert r.status_code == 202, r.text
            sent.append(encode_frame(ReportBatch(name, spec, TODAY, records, batch_id)))
    assert [v for _, _, v in transport.records] == sent
    # the document the SDK reads is unchanged: its parser refuses unknown fields
    assert plain.content == metrics.to_json().encode()
    assert set(parse_metrics(plain.content, reject_expired=False)) == set(metrics)
    int_field = doc["metrics"]["emoji_used"]["record"]["fields"][0]
    assert int_field == {
        "name": "seed",
        "dtype": "<u4",
        "json": {"type": "integer", "minimum": 0, "maximum": 2**32 - 1},
    }
