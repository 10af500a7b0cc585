"""Private set intersection over HTTP at 10^4, 10^5 and 10^6 items (estimator.psi, OpenMined's PSI).

The server is the real service, ``ldp psi serve`` started as a subprocess on 127.0.0.1 (a free port);
the client is :func:`estimator.psi.http.run_client` in this process. Both parties hold n items, half of
them common (two organisations' cohorts of enrolled devices). Per size and mode (10^6 in intersection
mode only: cardinality mode costs the same at 10^4 and 10^5): wall time of the whole query (client
blinding, the HTTP round trip with the server's work, the client's lookup), the bytes each way, and the
check that the intersection (or its size) is exact.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_psi.py            # 10^4, 10^5, 10^6 (several minutes)
    .venv/bin/python benchmarks/bench_psi.py --quick    # 10^4, 10^5

Results print as Markdown and go to ``benchmarks/results/psi.json`` (and ``psi.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

from estimator.psi.http import run_client

RESULTS = pathlib.Path(__file__).parent / "results" / "psi.json"
LDP = pathlib.Path(sys.executable).with_name("ldp")


def _serve(items_file: str, mode: str) -> tuple[subprocess.Popen, str]:
    cmd = [str(LDP), "psi", "serve", "--items", items_file, "--port", "0"]
    if mode == "cardinality":
        cmd.append("--cardinality-only")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"ldp psi serve did not start: {line!r}")
    return proc, m.group(1)


def bench(n: int, mode: str, tmp: str) -> dict:
    client = [f"device-{i:08d}" for i in range(n)]
    server = [f"device-{i:08d}" for i in range(n // 2, n)] + [f"partner-{i:08d}" for i in range(n // 2)]
    path = os.path.join(tmp, f"server-{n}.txt")
    with open(path, "w") as f:
        f.writelines(x + "\n" for x in server)
    proc, url = _serve(path, mode)
    try:
        r = run_client(url, client, mode)  # type: ignore[arg-type]
    finally:
        proc.terminate()
        proc.wait(30)
    expected = n - n // 2
    exact = r["intersection_size"] == expected and (
        r["intersection"] is None or set(r["intersection"]) == set(client[n // 2 :])
    )
    return {
        "items": n,
        "mode": mode,
        "seconds": r["seconds"],
        "client_request_s": r["client_request_s"],
        "client_finish_s": r["client_finish_s"],
        "request_bytes": r["request_bytes"],
        "answer_bytes": r["answer_bytes"],
        "bytes_per_item": (r["request_bytes"] + r["answer_bytes"]) / n,
        "plaintext_bytes": sum(len(x) + 1 for x in client),
        "intersection_size": r["intersection_size"],
        "exact": exact,
    }


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in ("intersection", "cardinality"):
        sel = [r for r in rows if r["mode"] == mode]
        a.plot([r["items"] for r in sel], [r["seconds"] for r in sel], marker="o", label=mode)
        b.plot([r["items"] for r in sel], [r["request_bytes"] + r["answer_bytes"] for r in sel], marker="o", label=mode)
    for ax, label in ((a, "seconds per query"), (b, "bytes both ways")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("items per party")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle("PSI over HTTP (openmined-psi, ECDH P-256 + GCS)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    sizes = (10**4, 10**5) if args.quick else (10**4, 10**5, 10**6)
    started, load_start = time.strftime("%Y-%m-%d %H:%M:%S %Z"), os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for mode in ("intersection", "cardinality") if n < 10**6 else ("intersection",):
                rows.append(bench(n, mode, tmp))
                print(json.dumps(rows[-1]), flush=True)
    out = {
        "started": started,
        "machine": platform.platform(),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "rows": rows,
    }
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2))
        plot(rows, RESULTS.with_suffix(".png"))
    print("| items per party | mode | seconds | request bytes | answer bytes | bytes per item | exact |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['items']:,} | {r['mode']} | {r['seconds']:.2f} | {r['request_bytes']:,} | {r['answer_bytes']:,} | "
            f"{r['bytes_per_item']:.1f} | {r['exact']} |"
        )


if __name__ == "__main__":
    main()
