"""Anonymous upload tokens: issuer signing rate and the collector's verification cost per upload.

    .venv/bin/python benchmarks/bench_tokens.py [--n 200]

* **blind_sign**: the issuer's RSA-2048 blind signature (Python-int CRT with base blinding,
  :func:`client_sdk.blind_rsa.blind_sign`), tokens per CPU-second on one core;
* **client**: the device's ``begin`` + ``finish`` (blind, unblind, verify) per token;
* **verify**: the collector's check of one ``Authorization`` header (parse, key lookup, challenge,
  RSASSA-PSS verification with ``cryptography``), per upload;
* **spend**: one insert into the spent-token store (SQLite WAL, a file in the temp folder).

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

from client_sdk import blind_rsa, tokens
from collector.issuer import public_key_entry, utc_day_of
from collector.tokens import SpentTokens, TokenVerifier


def rate(fn: object, n: int, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t0 = time.process_time()
        for i in range(n):
            fn(i)  # type: ignore[operator]
        runs.append(n / max(time.process_time() - t0, 1e-9))
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sk = blind_rsa.PrivateKey.generate(2048)
    pk = sk.public_key
    day = utc_day_of(time.time())
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
    out = {
        "blind_sign_per_s": round(sign_rate, 1),
        "client_finish_per_s": round(client_rate, 1),
        "collector_verify_per_s": round(verify_rate, 1),
        "collector_verify_us_per_upload": round(1e6 / verify_rate, 1),
        "spend_per_s": round(spend_rate, 1),
        "n": args.n,
    }
    Path("benchmarks/results").mkdir(parents=True, exist_ok=True)
    Path("benchmarks/results/tokens.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
