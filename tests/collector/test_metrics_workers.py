"""``ldp collector --workers 2``: the metrics listener shows the whole collector, not one worker's share.

A real 2-worker collector (uvicorn worker processes) on 127.0.0.1; uploads on fresh connections until
both workers have served some (read from the prometheus-client multiprocess folder the test hands it, one
file per worker); then the listener's totals must equal what was sent. Before: no listener at all with
``--workers`` > 1 (and ``--public-metrics`` gave whichever worker answered).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from prometheus_client import multiprocess

from ldp_core.wire.frames import FRAME_CONTENT_TYPE, encode_frame
from tests.support.collector_support import olh_batch, write_metrics

ROOT = Path(__file__).resolve().parents[2]
PORT = 21310  # helper C's range; the metrics listener takes a free port
UPLOADS = "ldp_collector_request_duration_seconds_count"


def per_worker_uploads(folder: Path) -> dict[str, float]:
    """``POST /v1/reports`` requests counted by each worker, from its own histogram file."""
    out = {}
    for f in folder.glob("histogram_*.db"):
        for family in multiprocess.MultiProcessCollector.merge([str(f)], accumulate=True):  # type: ignore[no-untyped-call]
            for s in family.samples:
                if s.name == UPLOADS and s.labels.get("route") == "/v1/reports":
                    out[f.stem] = s.value
    return out


def sample(text: str, pattern: str, missing: float | None = None) -> float:
    m = re.search("^" + pattern + r" (\S+)$", text, re.M)
    if m is None and missing is not None:
        return missing
    assert m, f"no sample {pattern}: {text}"
    return float(m.group(1))


def test_two_workers_metrics_are_the_whole_collectors(tmp_path: Path) -> None:
    metrics = write_metrics(tmp_path / "m.json")
    folder = tmp_path / "prom"
    folder.mkdir()
    argv = [sys.executable, "-m", "ldp_cli.main", "collector", "--metrics", str(tmp_path / "m.json")]
    argv += ["--transport", f"sqlite:///{tmp_path}/log.sqlite3", "--dedup", str(tmp_path / "ids.sqlite3")]
    argv += ["--port", str(PORT), "--workers", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LDP_COLLECTOR_")}
    env.update(PYTHONPATH=str(ROOT), PROMETHEUS_MULTIPROC_DIR=str(folder))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        out = proc.stdout
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(out), daemon=True).start()  # keeps the pipe drained
        start = time.monotonic()
        while (m := re.search(r"operational metrics on (http://\S+/metrics)", "".join(lines))) is None:
            assert time.monotonic() - start < 30, f"no metrics listener with --workers 2: {lines!r}"
            time.sleep(0.1)
        murl, url = m.group(1), f"http://127.0.0.1:{PORT}"
        deadline = time.monotonic() + 40
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the workers never became ready"
            time.sleep(0.1)
        sent = refused = 0
        while True:  # fresh connections until each worker has served uploads (at most 400, 20 s)
            codes: list[int] = []

            def upload(i: int, codes: list[int] = codes) -> None:
                body = encode_frame(olh_batch(metrics, 5, first_seed=5 * i))
                codes.append(
                    httpx.post(
                        url + "/v1/reports", content=body, headers={"content-type": FRAME_CONTENT_TYPE}
                    ).status_code
                )

            threads = [threading.Thread(target=upload, args=(sent + j,)) for j in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert codes == [202] * 8, codes
            sent += 8
            r = httpx.post(url + "/v1/reports", content=b"x", headers={"content-type": "text/plain"})
            assert r.status_code == 415
            refused += 1
            workers = {k: v for k, v in per_worker_uploads(folder).items() if v > 0}
            if len(workers) >= 2:
                break
            assert sent < 400 and time.monotonic() < deadline + 20, f"uploads reached one worker only: {workers}"
        end = time.monotonic() + 10
        while True:  # the stored counters are written by each worker at least once a second
            text = httpx.get(murl, timeout=10).text
            accepted = sample(text, r'ldp_collector_batches_total\{outcome="accepted",reason="[^"]*"\}')
            rejected = sample(
                text, r'ldp_collector_batches_total\{outcome="rejected",reason="unsupported_media_type"\}', 0
            )
            if (accepted, rejected) == (sent, refused) or time.monotonic() > end:
                break
            time.sleep(0.2)
        total = sample(text, UPLOADS + r'\{method="POST",route="/v1/reports"\}')
        in_flight = sample(text, "ldp_collector_uploads_in_flight")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert len(workers) == 2, workers
    assert total == sent + refused == sum(workers.values()), (total, sent, refused, workers)
    assert accepted == sent and rejected == refused
    assert in_flight == 0
