"""The table of ``benchmarks/side_by_side.sh``: medians over the rounds, per CPU second, before and after.

Usage: ``.venv/bin/python benchmarks/side_by_side_table.py OUT [--json]``. CPU-time rates (what load from
other processes does not dilute) for the oracles; CPU seconds per million reports for the collector and
the shuffler; the median of the after/before ratios last.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
from typing import Any


def _runs(out: pathlib.Path, kind: str, side: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(out.glob(f"{kind}-{side}-*.json"))]


def table(out: pathlib.Path) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    ratios: list[float] = []
    before, after = _runs(out, "oracles", "before"), _runs(out, "oracles", "after")
    if not before or not after:
        raise SystemExit(f"no oracle figures for both sides in {out}")
    for mech in before[0]["rows"]:
        row = {}
        for key in ("encode_rate_cpu", "server_rate_cpu"):
            b = statistics.median(r["rows"][mech]["ours"][key] for r in before)
            a = statistics.median(r["rows"][mech]["ours"][key] for r in after)
            row[key] = {"before": b, "after": a, "ratio": a / b}
            ratios.append(a / b)
        rows[mech] = row
    for stage, key in (("ingest", "collector_cpu_s_per_m_reports"), ("shuffle", "cpu_s_per_m_reports")):
        sides = {}
        for side in ("before", "after"):
            vals = [r[stage][key] for r in _runs(out, "ingest", side) if key in r.get(stage, {})]
            sides[side] = statistics.median(vals) if vals else None
        if sides["before"] and sides["after"]:
            # fewer CPU seconds is faster: the speed ratio is before/after
            sides["ratio"] = sides["before"] / sides["after"]
            ratios.append(sides["ratio"])
        rows[stage] = sides
    return {"rows": rows, "median_speed_ratio_after_over_before": statistics.median(ratios)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    t = table(args.out)
    if args.json:
        print(json.dumps(t, indent=1))
        return
    print("| benchmark | before | after | speed after/before |\n|---|---|---|---|")
    for name, row in t["rows"].items():
        if name in ("ingest", "shuffle"):
            if row.get("ratio") is not None:
                print(
                    f"| {name}: CPU s per million reports | {row['before']:.3f} | {row['after']:.3f} | {row['ratio']:.2f} |"
                )
            continue
        for key, label in (("encode_rate_cpu", "encode"), ("server_rate_cpu", "server")):
            v = row[key]
            print(
                f"| {name} {label}, M/s per CPU s | {v['before'] / 1e6:.1f} | {v['after'] / 1e6:.1f} | {v['ratio']:.2f} |"
            )
    print(f"\nmedian speed ratio after/before: {t['median_speed_ratio_after_over_before']:.2f}")


if __name__ == "__main__":
    main()
