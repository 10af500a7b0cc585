"""Anonymous upload tokens: issuer signing rate and the collector's verification cost per upload.

    .venv/bin/python benchmarks/bench_tokens.py [--n 200]

* **blind_sign**: the issuer's RSA-2048 blind signature (Python-int CRT with base blinding,
  :func:`ldp_core.tokens.blind_rsa.blind_sign`), tokens per CPU-second on one core;
* **client**: the device's ``begin`` + ``finish`` (blind, unblind, verify) per token;
* **verify**: the collector's check of one ``Authorization`` header (parse, key lookup, challenge,
  RSASSA-PSS verification with ``cryptography``), per upload;
* **spend**: one insert into the spent-token store (SQLite WAL, a file in the temp folder);
* **collector** (``--collector``): uploads per second (wall clock) through the real collector (uvicorn on
  127.0.0.1, the embedded log), one HTTP client posting ``--uploads`` frames of ``B`` OLH reports each for
  every ``B`` of ``--batch``, once with ``--require-tokens`` (each upload paying with a fresh token, the
  metric's ``max_reports_per_day`` = B) and once without: the whole cost of tokens on the upload path.

A token is checked once per upload, so its cost per report is ``verify / batch size``. Medians of
``--repeat`` runs; results in ``benchmarks/results/tokens.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from collector.issuer import public_key_entry
from collector.tokens import SpentTokens, TokenVerifier
from ldp_core.days import utc_iso_day
from ldp_core.tokens import blind_rsa
from ldp_core.tokens import privacy_pass as tokens


def rate(fn: object, n: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.process_time()
        for i in range(n):
            fn(i)  # type: ignore[operator]
        runs.append(n / max(time.process_time() - t0, 1e-9))
    return statistics.median(runs)


def collector_rates(sk: blind_rsa.PrivateKey, batch: int, uploads: int, repeat: int) -> dict[str, float]:
    """Uploads/s through the real collector with and without ``--require-tokens`` (module docstring)."""
    import httpx
    import numpy as np

    from client_sdk.upload.uploader import FRAME_CONTENT_TYPE
    from collector.http.app import create_app
    from collector.settings import CollectorSettings
    from ldp_core.days import utc_day
    from ldp_core.metrics import parse_metrics
    from ldp_core.wire.frames import ReportBatch, encode_frame
    from pipeline.transport import open_transport
    from simulator.stack import serve_in_thread

    pk = sk.public_key
    day = utc_iso_day(time.time())
    doc = {
        "format": "ldp-metrics/1",
        "metrics": {
            "m": {
                "description": "bench",
                "owner": "bench@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "olh", "epsilon": 1.0},
                "domain": {"kind": "hashed", "size": 1024, "seed": 0},
                "max_reports_per_day": batch,
            }
        },
    }
    spec = parse_metrics(doc, reject_expired=False)["m"].spec
    rng = np.random.default_rng(1)
    out: dict[str, float] = {}
    for required in (False, True):
        runs = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as d:
                (Path(d) / "metrics.json").write_text(json.dumps(doc))
                (Path(d) / "keys").mkdir()
                (Path(d) / "keys" / "token-key-x.json").write_text(json.dumps(public_key_entry(day, pk)))
                settings = CollectorSettings(
                    metrics_path=f"{d}/metrics.json",
                    transport_url=f"sqlite:///{d}/log.sqlite3",
                    dedup_path=f"{d}/ids.sqlite3",
                    raw_partitions=1,
                    require_tokens=required,
                    token_keys=f"{d}/keys",
                    token_origin="c",
                    spent_path=f"{d}/spent.sqlite3",
                )
                bodies = [
                    encode_frame(
                        ReportBatch(
                            "m",
                            spec,
                            utc_day(time.time()),
                            spec.encode(rng.integers(0, 1024, batch), rng),
                            rng.bytes(16),
                        )
                    )  # noqa: E501
                    for _ in range(uploads)
                ]
                auth: list[dict[str, str]] = [{} for _ in bodies]
                if required:
                    for h in auth:
                        p = tokens.begin(pk, issuer_name="ldp-issuer", origin="c", day=day)
                        tok = tokens.finish(pk, p, blind_rsa.blind_sign(sk, p.request[3:]))
                        h["Authorization"] = tokens.authorization_header(tok)
                transport = open_transport(settings.transport_url)
                server, url, _ = serve_in_thread(create_app(settings, transport=transport))
                try:
                    with httpx.Client(base_url=url, timeout=60) as http:
                        t0 = time.perf_counter()
                        for body, h in zip(bodies, auth, strict=True):
                            r = http.post(
                                "/v1/reports", content=body, headers={"Content-Type": FRAME_CONTENT_TYPE, **h}
                            )
                            if r.status_code != 202:
                                raise RuntimeError(f"the collector answered {r.status_code}: {r.text}")
                        runs.append(uploads / (time.perf_counter() - t0))
                finally:
                    server.should_exit = True
                    time.sleep(0.2)
                    transport.close()
        out["with_tokens" if required else "without_tokens"] = round(statistics.median(runs), 1)
    out["batch"] = batch
    out["reports_per_s_with_tokens"] = round(out["with_tokens"] * batch, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--collector", action="store_true", help="also time uploads through the real collector")
    ap.add_argument("--batch", default="1,64", help="--collector: reports per upload (comma-separated)")
    ap.add_argument("--uploads", type=int, default=200, help="--collector: uploads per run")
    args = ap.parse_args()
    sk = blind_rsa.PrivateKey.generate(2048)
    pk = sk.public_key
    day = utc_iso_day(time.time())
    pend = [tokens.begin(pk, issuer_name="ldp-issuer", origin="c", day=day) for _ in range(args.n)]
    blinded = [p.request[3:] for p in pend]
    sign_rate = rate(lambda i: blind_rsa.blind_sign(sk, blinded[i]), args.n, args.repeat)
    sigs = [blind_rsa.blind_sign(sk, b) for b in blinded]
    client_rate = rate(lambda i: tokens.finish(pk, pend[i], sigs[i]), args.n, args.repeat)
    toks = [tokens.finish(pk, p, s) for p, s in zip(pend, sigs, strict=True)]
    headers = [tokens.authorization_header(t) for t in toks]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "token-key-x.json").write_text(json.dumps(public_key_entry(day, pk)))
        v = TokenVerifier(d, issuer_name="ldp-issuer", origin="c")
        verify_rate = rate(lambda i: v.verify(headers[i]), args.n, args.repeat)
        store = SpentTokens(os.path.join(d, "spent.sqlite3"))
        ctr = iter(range(10**9))
        spend_rate = rate(lambda i: store.spend(next(ctr).to_bytes(32, "big"), b"b" * 16, day), args.n, args.repeat)
        store.close()
    out: dict[str, object] = {
        "blind_sign_per_s": round(sign_rate, 1),
        "client_finish_per_s": round(client_rate, 1),
        "collector_verify_per_s": round(verify_rate, 1),
        "collector_verify_us_per_upload": round(1e6 / verify_rate, 1),
        "spend_per_s": round(spend_rate, 1),
        "n": args.n,
    }
    if args.collector:
        out["collector_uploads_per_s"] = [
            collector_rates(sk, int(b), args.uploads, args.repeat) for b in args.batch.split(",")
        ]
    Path("benchmarks/results").mkdir(parents=True, exist_ok=True)
    Path("benchmarks/results/tokens.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
