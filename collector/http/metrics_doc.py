"""``GET /v1/metrics``: the metrics document the SDKs read (:mod:`ldp_core.metrics`: every declared metric,
as parsed), with an ``ETag``, and its ``?layout=1`` form, which adds each metric's spec ids and record
layout for clients written without an SDK."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricSet

__all__ = ["MetricsDocument", "add_metrics_route", "metrics_layout", "record_layout"]


def record_layout(spec: ReportSpec) -> dict[str, Any]:
    """How one record of ``spec`` is laid out: in a frame (packed little-endian fields, numpy type strings) and
    in the JSON form (a list of the fields' values in order: an integer, or a hex string for a byte array)."""
    dtype = spec.record_dtype
    types: Mapping[str, tuple[Any, ...]] = dtype.fields or {}  # a record dtype is structured
    fields: list[dict[str, Any]] = []
    for name in dtype.names or ():
        ftype = types[name][0]
        if ftype.subdtype is not None:
            base, shape = ftype.subdtype
            fields.append(
                {
                    "name": name,
                    "dtype": base.str,
                    "shape": list(shape),
                    "json": {"type": "string", "format": f"hex, {ftype.itemsize} bytes"},
                }
            )
        else:
            info = np.iinfo(ftype)
            fields.append(
                {
                    "name": name,
                    "dtype": ftype.str,
                    "json": {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)},
                }
            )
    return {"itemsize": dtype.itemsize, "fields": fields, "json_record": [f["name"] for f in fields]}


def metrics_layout(declared: MetricSet) -> dict[str, Any]:
    """The metrics document with, per metric, its ``spec_id``, the ``accepted_spec_ids`` and its ``record``
    layout (:func:`record_layout`) added (``GET /v1/metrics?layout=1``)."""
    doc = declared.to_dict()
    for name, entry in doc["metrics"].items():
        spec = declared.prio3_spec(name) if name in declared.prio3 else declared[name].spec
        entry["spec_id"] = spec.spec_id
        entry["accepted_spec_ids"] = [spec.spec_id]
        entry["record"] = record_layout(spec)
    return doc


def _etag(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


class MetricsDocument:
    """The bodies ``GET /v1/metrics`` serves for one set of declared metrics, each with its ``ETag``."""

    def __init__(self, declared: MetricSet) -> None:
        #: the document (what the decode processes parse, too)
        self.body = declared.to_json().encode()
        self.etag = _etag(self.body)
        self.layout_body = json.dumps(metrics_layout(declared), indent=2, ensure_ascii=False).encode()
        self.layout_etag = _etag(self.layout_body)

    def answer(self, request: Request) -> Response:
        """The answer to ``request`` (200, or 304 when its ``If-None-Match`` is the served body's ``ETag``)."""
        if request.query_params.get("layout", "").lower() in ("1", "true", "yes"):
            body, etag = self.layout_body, self.layout_etag
        else:
            body, etag = self.body, self.etag
        headers = {"ETag": etag, "Cache-Control": "public, max-age=300"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)


_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "layout",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
        "description": "1: add each metric's spec_id, accepted_spec_ids and record layout",
    },
]


def add_metrics_route(app: FastAPI, document: MetricsDocument) -> None:
    """Serve ``document`` at ``GET /v1/metrics``."""

    @app.get(
        "/v1/metrics",
        summary="The declared metrics (the document the SDK reads)",
        responses={200: {"content": {"application/json": {}}}, 304: {"description": "not modified"}},
        openapi_extra={"parameters": _PARAMETERS},
    )
    async def get_metrics(request: Request) -> Response:
        """The metrics document the SDK reads. With ``?layout=1`` each metric also carries its ``spec_id``
        (and the ids still accepted) and its ``record`` layout: the fields' numpy types and the JSON form's
        record shape, for clients written without the SDK. (Not by default: the SDK's parser refuses
        unknown fields.)"""
        return document.answer(request)
