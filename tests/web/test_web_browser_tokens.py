"""Anonymous tokens in headless Chromium: a page on its own origin (``http://127.0.0.1:21541``, helper W2's
port range; a node HTTP server) gets tokens with the built bundle from the real ``ldp issuer`` and pays each
upload to the real ``ldp collector --require-tokens`` with one, both on other origins that allow the page's
(``--allow-origin``; ``sdk-web/test/browser/tokens.ts``). What runs in the browser: the key
documents of the issuer and the collector (the key-consistency check), the Ed25519-signed token request,
RFC 9578 blind RSA with the browser's Web Crypto, the IndexedDB wallet and the ``Authorization`` header
through CORS. Chromium and node are required (assertions, not skips).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ldp_core.tokens.enrollment import EnrollmentAuthority
from tests.sdk.test_sdk_tokens import METRICS, ORIGIN, ROOT, free_port
from tests.support.sdk_collector import collector_factory  # noqa: F401  (fixture)
from tests.web.node_support import run_tsx
from tests.web.test_web_browser import CHROMIUM

PAGE_ORIGIN = "http://127.0.0.1:21541"


def test_the_bundle_pays_each_upload_with_a_token_from_chromium(
    tmp_path: Path,
    collector_factory: Callable[..., Any],  # noqa: F811
) -> None:
    assert os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} is required (apt-get install -y chromium)"
    authority = EnrollmentAuthority.generate()
    authority.save(tmp_path / "authority.key")
    authority.enroll("browser-1").save(tmp_path / "browser-1.json")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    keys = [sys.executable, "-m", "ldp_cli.main", "issuer", "keys", "--state", str(tmp_path / "issuer"), "--days", "2"]
    subprocess.run(keys, check=True, env=env, cwd=ROOT, capture_output=True)
    col = collector_factory(
        metrics=METRICS,
        allow_origin=PAGE_ORIGIN,
        require_tokens=True,
        token_keys=tmp_path / "issuer" / "public",
        token_origin=ORIGIN,
        spent_tokens=tmp_path / "spent.sqlite3",
    )
    port = free_port()
    issuer = subprocess.Popen(
        [
            *(sys.executable, "-m", "ldp_cli.main", "issuer", "serve", "--state", str(tmp_path / "issuer")),
            *("--authority", str(tmp_path / "authority.key"), "--tokens-per-day", "20", "--port", str(port)),
            *("--allow-origin", PAGE_ORIGIN),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        line = issuer.stdout.readline() if issuer.stdout else ""
        assert "listening on" in line, (line, issuer.stderr.read() if issuer.stderr else "")
        config = {
            "pageOrigin": PAGE_ORIGIN,
            "collectorUrl": col.url,
            "issuerUrl": f"http://127.0.0.1:{port}",
            "device": (tmp_path / "browser-1.json").read_text(),
            "origin": ORIGIN,
        }
        out = run_tsx("test/browser/tokens.ts", json.dumps(config), CHROMIUM, timeout=300)
    finally:
        issuer.terminate()
        issuer.communicate(timeout=30)
    flushes = out["flushes"]
    assert [f["ok"] for f in flushes] == [True, True, True], out
    assert [f["sent"]["reports"] for f in flushes] == [1, 1, 1]
    assert out["pending"] == 0 and out["errors"]["token_key_inconsistent"] == 0, out
    assert out["stats"]["tokens_fetched"] >= 3
    st = col.stats()
    assert st["accepted"] == 3 and st["invalid"] == 0, st
