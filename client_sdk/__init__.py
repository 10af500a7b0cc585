"""The device side: mechanism specs and encoders, hashing, the wire format.

Importing this package needs only numpy and xxhash.
"""

from client_sdk.errors import BudgetError, DomainError, FrameError, LDPError, SpecError, SpecMismatchError
from client_sdk.mechanisms import MECHANISMS, MechanismSpec, make_spec, spec_from_dict
from client_sdk.wire import ReportBatch, decode_frame, decode_json, encode_frame, encode_json

__all__ = [
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
    "decode_frame",
    "decode_json",
    "encode_frame",
    "encode_json",
]
