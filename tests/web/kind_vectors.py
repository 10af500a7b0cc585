"""Shared vectors of the web SDK's numeric, repeated and heavy-hitter kinds (``ldp_core/vectors/kinds.json``).

Written by ``scripts/make-web-vectors`` with the other vector files (:mod:`tests.web.make_vectors`, whose
:class:`~tests.web.make_vectors.RecordingGenerator` records the draws). For each spec: its id and memo
derivation id, and per value the draws the Python encoder consumed and the record bytes, then the binary and
JSON frames of all of them; ``sdk-web/test/kinds_vectors.test.ts`` replays the draws through the TypeScript
encoders and must produce the same bytes.

Reports are encoded as the Python client encodes them (``client_sdk.client.TelemetryClient._encode``): mean
and Square Wave specs by ``encode_one`` (the batch path with one value), the memoized 1bitmean, dbitflip and
loloha through :class:`client_sdk.memo.MemoStore` (the per-metric key of a fixed device secret), PEM at an
explicit level (a device passes its own, :meth:`PEMSpec.level_for_device`, also recorded) and SFP by
``encode``. Simulation encoders (a fresh device per report) are recorded where the TypeScript one draws the
same (1bitmean and loloha; dbitflip's fresh buckets come from ``argpartition``, whose order is not reproduced).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from client_sdk.memo import MemoStore
from ldp_core.canonical import canonical_json
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.heavy_hitters import PEMSpec, pad_value, prefix_keys
from ldp_core.mechanisms.numeric import EPSILON_STAR, best_mean_mechanism
from ldp_core.wire.frames import ReportBatch, batch_to_json_obj, encode_frame, encode_json

__all__ = ["build_kind_vectors"]

_SECRET = bytes(range(32))
_BATCH_ID = bytes.fromhex("00112233445566778899aabbccddeeff")
_DAY = 20_454

#: (name, given parameters, values): numbers (lists for several attributes), indices (loloha) or strings
_NUMERIC: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("duchi", {"epsilon": 1.0, "low": 0, "high": 240}, [0, 240, 100.5, 37.25]),
    ("duchi", {"epsilon": 5.0, "low": -1, "high": 1, "dims": 3, "sample": 2}, [[0.5, -1, 1], [0, 0, 0.25]]),
    ("pm", {"epsilon": 1.0, "low": 0, "high": 240}, [0, 240, 100.5, 37.25]),
    (
        "pm",
        {"epsilon": 2.0, "low": -5.5, "high": 5.5, "dims": 257, "sample": 2},
        [[(i % 11) - 5.5 for i in range(257)]],
    ),
    ("hm", {"epsilon": 1.0, "low": 0, "high": 240}, [0, 240, 100.5, 200]),
    ("hm", {"epsilon": 0.5, "low": 0, "high": 1}, [0, 1, 0.3]),
    ("hm", {"epsilon": 6.0, "low": 0, "high": 10, "dims": 4}, [[1, 2, 3, 10], [0, 0, 0, 0]]),
    ("sw", {"epsilon": 1.0, "low": 0, "high": 240, "bins": 64}, [0, 240, 100.5, 120]),
    ("sw", {"epsilon": 3.0, "low": -1, "high": 1.5, "bins": 200}, [-1, 1.5, 0.1]),
]
_MEMOIZED: list[tuple[str, dict[str, Any], list[Any]]] = [
    ("1bitmean", {"epsilon": 1.0, "low": 0, "high": 100, "granularity": 16}, [0, 100, 33.3, 33.3, 50]),
    ("1bitmean", {"epsilon": 0.5, "low": -3, "high": 3.5, "granularity": 64}, [-3, 3.5, 1.0]),
    ("dbitflip", {"epsilon": 2.0, "low": 0, "high": 240, "buckets": 32}, [0, 240, 100, 100]),
    ("dbitflip", {"epsilon": 1.0, "low": 0, "high": 1, "buckets": 300, "sample": 10}, [0, 1, 0.5]),
    ("loloha", {"epsilon": 2.0, "domain_size": 100}, [0, 99, 5, 5]),
    ("loloha", {"epsilon": 4.0, "domain_size": 1000, "epsilon_one": 1.0, "g": 7}, [999, 0, 3]),
]
_PEM: list[tuple[dict[str, Any], list[tuple[str, int]]]] = [
    (
        {"epsilon": 4.0, "length": 8, "start_bits": 12, "step_bits": 4, "overflow": "truncate"},
        [
            ("weather", 0),
            ("weather", 4),
            ("weather", 12),
            ("news", 5),
            ("a", 7),
            ("日本語テキスト", 12),
            ("café au lait", 9),
        ],
    ),
    (
        {"epsilon": 2.0, "length": 6, "start_bits": 10, "step_bits": 3, "oracle": "hcms", "num_hashes": 8, "width": 64},
        [("hello", 0), ("hello", 13), ("ab", 6)],
    ),
]
_SFP: list[tuple[dict[str, Any], list[str]]] = [
    (
        {"epsilon": 2.0, "length": 8, "sketch": "hcms", "num_hashes": 16, "width": 64},
        ["weather", "news", "a", "日本語"],
    ),
    (
        {"epsilon": 4.0, "length": 6, "sketch": "cms", "num_hashes": 8, "width": 100, "word_share": 0.25},
        ["abcdef", "x"],
    ),
]
_PAD: list[tuple[Any, int, str]] = [
    ("weather", 8, "truncate"),
    ("a", 4, "truncate"),
    ("abcdefgh", 8, "refuse"),
    ("abcdefghi", 8, "truncate"),
    ("abcdefghi", 8, "refuse"),
    ("café", 4, "truncate"),
    ("😀x", 3, "truncate"),
    ("a😀", 4, "truncate"),
    ("a😀", 3, "truncate"),
    ("", 4, "truncate"),
    ("a\x00b", 4, "truncate"),
    ("tab\tx", 8, "truncate"),
]


def _fields(records: np.ndarray) -> list[Any]:
    row: list[Any] = []
    for name in records.dtype.names or ():
        val = records[0][name]
        row.append(val.tobytes().hex() if isinstance(val, np.ndarray) else int(val))
    return row


def _entry(name: str, given: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    spec = make_spec(name, **given)
    return spec, {
        "name": name,
        "given": given,
        "spec": spec.to_dict(),
        "canonical": canonical_json(spec.to_dict()).decode("utf-8"),
        "spec_id": spec.spec_id,
        "memo_derivation_id": spec.memo_derivation_id,
        "record_size": spec.record_size,
    }


def _frame(entry: dict[str, Any], spec: Any, metric: str, records: list[np.ndarray]) -> None:
    batch = ReportBatch(metric, spec, _DAY, np.concatenate(records), _BATCH_ID)
    entry["frame"] = {
        "metric": metric,
        "day": _DAY,
        "batch_id": _BATCH_ID.hex(),
        "binary": encode_frame(batch).hex(),
        "json": encode_json(batch),
    }
    assert batch_to_json_obj(batch)["records"] == [c["fields"] for c in entry["cases"]]


def _case(value: Any, tokens: list[str], start: int, records: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {
        "value": value,
        **extra,
        "draws": tokens[start:],
        "record": records.tobytes().hex(),
        "fields": _fields(records),
    }


def build_kind_vectors(recording: Any, seed0: int = 50_000) -> dict[str, Any]:
    """The content of ``kinds.json``; ``recording`` is the RecordingGenerator class."""
    numeric = []
    for i, (name, given, values) in enumerate(_NUMERIC):
        spec, entry = _entry(name, given)
        rec = recording(seed0 + i)
        cases, records = [], []
        for v in values:
            start = len(rec.tokens)
            r = spec.encode_one(v, rec)
            cases.append(_case(v, rec.tokens, start, r))
            records.append(r)
        entry["cases"] = cases
        _frame(entry, spec, f"web.{name}", records)
        numeric.append(entry)
    memoized = []
    for i, (name, given, values) in enumerate(_MEMOIZED):
        spec, entry = _entry(name, given)
        metric = f"web.{name}"
        memo = MemoStore(_SECRET)
        key = memo.metric_secret(metric, spec.memo_derivation_id)
        rec = recording(seed0 + 100 + i)
        cases, records = [], []
        dtype = np.int64 if name == "loloha" else np.float64
        for v in values:
            start = len(rec.tokens)
            r = memo.encode(metric, spec, np.array([v], dtype=dtype), rec)
            cases.append(_case(v, rec.tokens, start, r))
            records.append(r)
        entry["device_secret"] = _SECRET.hex()
        entry["metric_secret"] = key.hex()
        entry["cases"] = cases
        _frame(entry, spec, metric, records)
        if name != "dbitflip":
            sim = recording(seed0 + 200 + i)
            entry["simulation_cases"] = []
            for v in values:
                start = len(sim.tokens)
                r = spec.encode_one(v, sim)
                entry["simulation_cases"].append(_case(v, sim.tokens, start, r))
        memoized.append(entry)
    pem = []
    for i, (given, pairs) in enumerate(_PEM):
        spec, entry = _entry("pem", given)
        assert isinstance(spec, PEMSpec)
        entry["num_levels"] = spec.num_levels
        entry["device_secret"] = _SECRET.hex()
        entry["device_level"] = spec.level_for_device(_SECRET)
        rec = recording(seed0 + 300 + i)
        cases, records = [], []
        for value, level in pairs:
            padded = spec.pad([value])
            key = int(prefix_keys(padded, spec.level_bits(level))[0])
            start = len(rec.tokens)
            r = spec.encode(padded, rec, levels=[level])
            cases.append(_case(value, rec.tokens, start, r, level=level, padded=padded.tobytes().hex(), key=key))
            records.append(r)
        entry["cases"] = cases
        _frame(entry, spec, "web.pem", records)
        sim = recording(seed0 + 400 + i)
        start = len(sim.tokens)
        r = spec.encode([pairs[0][0]], sim)
        entry["simulation_case"] = _case(pairs[0][0], sim.tokens, start, r)
        pem.append(entry)
    sfp = []
    for i, (given, words) in enumerate(_SFP):
        spec, entry = _entry("sfp", given)
        rec = recording(seed0 + 500 + i)
        cases, records = [], []
        for w in words:
            padded = spec.pad([w])
            start = len(rec.tokens)
            r = spec.encode(padded, rec)
            extra = {"word_key": int(spec.word_keys(padded)[0]), "tag": int(spec.word_tags(padded)[0])}
            cases.append(_case(w, rec.tokens, start, r, **extra))
            records.append(r)
        entry["cases"] = cases
        _frame(entry, spec, "web.sfp", records)
        sfp.append(entry)
    pads = []
    for value, length, overflow in _PAD:
        try:
            pads.append(
                {
                    "value": value,
                    "length": length,
                    "overflow": overflow,
                    "padded": pad_value(value, length, overflow).hex(),
                }
            )  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 -- DomainError: the TS side must refuse it too
            pads.append({"value": value, "length": length, "overflow": overflow, "error": type(exc).__name__})
    auto = [
        {"epsilon": e, "dims": d, "mechanism": best_mean_mechanism(e, d)}
        for e in (0.1, 0.5, 0.6, 0.65, 1.0, 2.0, 4.0, 8.0)
        for d in (1, 5)
    ]
    return {
        "numeric": numeric,
        "memoized": memoized,
        "pem": pem,
        "sfp": sfp,
        "pad_values": pads,
        "auto": {"epsilon_star": EPSILON_STAR, "choices": auto},
    }
