"""Decoding an upload's body (a binary frame or the JSON form) against the declared metrics, and the decode
processes that turn large JSON bodies into frames off the event loop."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import logging
import math
import multiprocessing
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from collector.errors import RejectedBatch
from ldp_core.errors import FrameError, SpecError, SpecMismatchError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricSet, parse_metrics
from ldp_core.wire.frames import (
    ReportBatch,
    VerifiedSpecs,
    decode_frame,
    decode_json,
    decode_verified,
    encode_frame,
    read_header,
)
from ldp_core.wire.sealed import SealedSpec

__all__ = [
    "Checked",
    "SpecEntry",
    "decode_body",
    "frame_specs",
    "json_decode_pool",
    "spec_entries",
    "json_to_frame",
    "resolve",
]

#: a frame's fields as the native front's pre-check gives them: (metric, spec id in hex, day, record size,
#: records, batch id, sealed, records checked)
Checked = tuple[str, str, int, int, int, bytes, bool, bool]
#: one entry of :func:`frame_specs`
SpecEntry = tuple[str, bool, bytes, int, list[tuple[int, int, int, int]], bool, list[bytes]]

log = logging.getLogger("ldp.collector")


def resolve(declared: MetricSet, metric: str, spec_id: str) -> ReportSpec:
    """The spec a batch of ``metric`` made under ``spec_id`` is decoded with; 422 if there is none."""
    m = declared.get(metric)
    if m is None and metric in declared.prio3:  # a Prio3 metric: opaque shares for the aggregators (docs/PRIO3.md)
        p3 = declared.prio3_spec(metric)
        if p3.spec_id != spec_id:
            raise RejectedBatch(
                422,
                "spec_mismatch",
                f"prio3 metric {metric!r} is collected under spec {p3.spec_id} (its configuration and the "
                f"aggregators' keys), but the batch was made under spec {spec_id}; refresh GET /v1/metrics",
            )
        return p3
    if m is None:
        raise RejectedBatch(
            422,
            "unknown_metric",
            f"metric {metric!r} is not declared in the collector's "
            "metrics file; GET /v1/metrics lists the declared metrics",
        )
    if m.spec.spec_id != spec_id:
        raise RejectedBatch(
            422,
            "spec_mismatch",
            f"metric {metric!r} is collected under spec {m.spec.spec_id} ({m.spec.name}, "
            f"epsilon={m.spec.epsilon:g}), but the batch was made under spec {spec_id}; "
            "refresh the metric definitions from GET /v1/metrics",
        )
    return m.wire_spec  # a sealed metric's: opaque records, plain frames of it refused


def _too_many(n: int, max_records: int) -> RejectedBatch:
    return RejectedBatch(
        413,
        "too_many_records",
        f"the batch holds {n} reports; this collector takes at most {max_records} per batch: split it",
    )


def _decode_frame(
    body: bytes, declared: MetricSet, max_records: int, checked: Checked | None, verified: VerifiedSpecs | None
) -> ReportBatch:
    if checked is not None:  # the native front parsed the header, verified the CRC (and the records, if it says so)
        if checked[4] > max_records:
            raise _too_many(checked[4], max_records)
        return decode_verified(body, functools.partial(resolve, declared), checked, verified)
    header = read_header(body)
    if header.n_records > max_records:
        raise _too_many(header.n_records, max_records)
    return decode_frame(body, functools.partial(resolve, declared), header)


def _decode_json(body: bytes, declared: MetricSet, max_records: int) -> ReportBatch:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise RejectedBatch(400, "malformed", f"the JSON body does not parse: {str(exc)[:200]}") from None
    if isinstance(obj, dict) and isinstance(obj.get("records"), list) and len(obj["records"]) > max_records:
        raise _too_many(len(obj["records"]), max_records)
    return decode_json(obj, functools.partial(resolve, declared))


def decode_body(
    body: bytes,
    kind: str,
    declared: MetricSet,
    max_records: int,
    checked: Checked | None = None,
    verified: VerifiedSpecs | None = None,
) -> ReportBatch:
    """Decode one body (``kind`` ``"frame"`` or ``"json"``) against the declared metrics; :class:`RejectedBatch` if it does not.
    ``checked``: a frame's fields as the native front's pre-check gave them (:func:`frame_specs`), when it passed.
    ``verified``: :func:`~ldp_core.wire.frames.decode_verified`'s cache for pre-checked frames, kept with
    ``declared`` (the upload handler's): a frame of a metric, spec id, sealing and record size that resolved once
    is not resolved again."""
    if not body:
        raise RejectedBatch(400, "malformed", "the body is empty; send one report batch")
    try:
        if kind == "frame":
            return _decode_frame(body, declared, max_records, checked, verified)
        return _decode_json(body, declared, max_records)
    except RejectedBatch:
        raise
    except SpecMismatchError as exc:
        raise RejectedBatch(422, "spec_mismatch", str(exc)) from None
    except FrameError as exc:
        raise RejectedBatch(400, "malformed", str(exc)) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        log.warning("undecodable upload: %s", type(exc).__name__)
        raise RejectedBatch(400, "malformed", f"the batch does not decode ({type(exc).__name__})") from None


def frame_specs(declared: MetricSet) -> list[SpecEntry]:
    """What the native front's frame pre-check accepts of the declared metrics (``ldp_front.Front.set_frame_specs``,
    native/front/src/frames.rs): :func:`spec_entries` of each declared metric's wire spec (what :func:`resolve`
    answers), Prio3 metrics included."""
    specs: list[tuple[str, ReportSpec]] = [(name, declared[name].wire_spec) for name in declared]
    specs += [(name, declared.prio3_spec(name)) for name in declared.prio3]
    key_ids = [bytes.fromhex(k.key_id) for k in declared.analyzer_keys]
    return [entry for name, spec in specs for entry in spec_entries(name, spec, key_ids)]


def spec_entries(metric: str, spec: ReportSpec, key_ids: Sequence[bytes] = ()) -> list[SpecEntry]:
    """The pre-check's entries of ``metric`` resolved to ``spec``: one per sealing :func:`decode_frame` accepts
    (a sealed frame always; a plain one unless ``spec`` is sealed), each ``(metric, sealed, spec id, record
    size, bounds, records_checked, key_ids)``. ``bounds`` are the spec's :meth:`~ReportSpec.record_bounds` as
    ``(offset, width, count, bound)`` of little-endian unsigned fields, and ``records_checked`` says they are
    the spec's whole check of its records: true for the base class's check, false for a spec with a check of
    its own (which still runs in Python; the front then verifies the header and the CRC only). Sealed records
    have nothing to check without the key but the analyzer key each names (``key_ids``, the metrics file's
    analyzer keys): ``records_checked`` says the front checked that each record names one of them (the
    collector's admission then skips that scan, :meth:`collector.http.admission.Admission.check`)."""
    out: list[SpecEntry] = []
    try:
        sealed = SealedSpec.of(spec)
    except SpecError:  # no sealed form (a Prio3 spec: its shares are encrypted already): such frames go to Python
        pass
    else:
        ids = list(key_ids)
        out.append((metric, True, bytes.fromhex(sealed.spec_id), sealed.record_size, [], bool(ids), ids))
    if not isinstance(spec, SealedSpec):
        bounds = _bounds(spec)
        out.append((metric, False, bytes.fromhex(spec.spec_id), spec.record_size, bounds or [], bounds is not None, []))
    return out


def _bounds(spec: ReportSpec) -> list[tuple[int, int, int, int]] | None:
    """``spec``'s record checks as the front's bounds, or ``None`` if they are more than bounds it can check."""
    if type(spec).check_records is not ReportSpec.check_records:
        return None
    out: list[tuple[int, int, int, int]] = []
    fields: Mapping[str, Any] = spec.record_dtype.fields or {}
    for field, bound in spec.record_bounds().items():
        dtype, offset = fields[field][:2]
        base = dtype.base
        little = base.byteorder in ("<", "|") or (base.byteorder == "=" and sys.byteorder == "little")
        if base.kind != "u" or base.itemsize not in (1, 2, 4, 8) or not little or not 0 <= int(bound) < 2**64:
            return None
        out.append((int(offset), base.itemsize, math.prod(dtype.shape), int(bound)))
    return out


#: the decode process's metrics and record limit (set by :func:`_decode_worker_init`)
_WORKER: dict[str, Any] = {}


def _decode_worker_init(metrics_json: str, max_records: int) -> None:
    _WORKER["metrics"] = parse_metrics(metrics_json, reject_expired=False)
    _WORKER["max_records"] = max_records


def json_to_frame(body: bytes) -> bytes | tuple[int, str, str]:
    """In a decode process: a JSON form's batch as a binary frame, or the refusal ``(status, reason, message)``."""
    try:
        return encode_frame(decode_body(body, "json", _WORKER["metrics"], _WORKER["max_records"]))
    except RejectedBatch as exc:
        return exc.status, exc.reason, exc.message


def json_decode_pool(workers: int, metrics_json: str, max_records: int) -> concurrent.futures.ProcessPoolExecutor:
    """The decode processes for large JSON bodies (run :func:`json_to_frame` in them). Spawned, not forked:
    the collector's process runs threads (publishers, uvicorn's); a process starts on the first large body."""
    return concurrent.futures.ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_decode_worker_init,
        initargs=(metrics_json, max_records),
    )
