"""The device side: the telemetry client, mechanism specs and encoders, hashing, the wire format.

What an app embeds is :class:`TelemetryClient` (configured by a :class:`ClientConfig`), a
:class:`LocalPolicy` and a metrics file (:class:`MetricSet`, :func:`load_metrics`); see docs/SDK.md.
Importing this package needs only numpy, xxhash and the standard library.
"""

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig, ClientConfigError
from client_sdk.policy import LocalPolicy
from ldp_core.errors import BudgetError, DomainError, FrameError, LDPError, SpecError, SpecMismatchError
from ldp_core.mechanisms import MECHANISMS, MechanismSpec, make_spec, spec_from_dict
from ldp_core.metrics import MetricSet, MetricsFileError, load_metrics, parse_metrics
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, decode_frame, decode_json, encode_frame, encode_json

__all__ = [
    "TelemetryClient",
    "ClientConfig",
    "ClientConfigError",
    "LocalPolicy",
    "MetricSet",
    "MetricsFileError",
    "load_metrics",
    "parse_metrics",
    "BudgetError",
    "DomainError",
    "FrameError",
    "LDPError",
    "SpecError",
    "SpecMismatchError",
    "MECHANISMS",
    "MechanismSpec",
    "make_spec",
    "spec_from_dict",
    "ReportBatch",
    "FRAME_CONTENT_TYPE",
    "decode_frame",
    "decode_json",
    "encode_frame",
    "encode_json",
]
