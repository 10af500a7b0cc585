"""The two parties of an ECDH private set intersection (OpenMined's ``private_set_intersection``).

The client blinds each of its items with its secret exponent (H(x)^c on P-256) and sends them; the
server raises them to its own exponent s and returns them (shuffled in cardinality mode), together
with its own items as H(y)^s in a Golomb-compressed set sized for a false-positive rate ``fpr`` over
the whole client query. The client removes its exponent and looks its H(x)^s up in the set: it learns
which of its items the server holds (or only how many), and the size of the server's set; the server
learns the number of client items. Neither sees the other's items, nor their plain hashes.

Modes: ``intersection`` (the client learns the common items) and ``cardinality`` (only their number:
the server shuffles its answer, so the client cannot tell which of its items matched). Both sides must
run the same mode: the server refuses a request made for the other one.
"""

from __future__ import annotations

import dataclasses
import pathlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Literal

__all__ = ["Mode", "PsiError", "load_items", "PsiServer", "PsiClient", "ClientResult", "pack", "unpack"]

Mode = Literal["intersection", "cardinality"]
#: probability that any item of the whole client query is wrongly reported as common (the library's
#: ``fpr`` of ``CreateSetupMessage``: the Golomb-compressed set is sized for it)
DEFAULT_FPR = 1e-9


class PsiError(ValueError):
    """Bad input or a request that does not fit the server's mode or limits."""


def _psi() -> Any:
    try:
        import private_set_intersection.python as psi
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError("private set intersection needs openmined-psi: pip install 'ldp-telemetry[pets]'") from e
    return psi


def load_items(path: str | pathlib.Path) -> list[str]:
    """One item a line (UTF-8), surrounding spaces stripped, blank lines skipped, duplicates kept once
    (first occurrence order)."""
    p = pathlib.Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PsiError(f"no items file at {p}") from None
    except UnicodeDecodeError as e:
        raise PsiError(f"{p} is not UTF-8 text: {e}") from None
    items = dict.fromkeys(line.strip() for line in text.splitlines())
    items.pop("", None)
    if not items:
        raise PsiError(f"{p} holds no items")
    return list(items)


def pack(parts: Sequence[bytes]) -> bytes:
    """Length-prefixed concatenation (u64 little-endian before each part)."""
    return b"".join(struct.pack("<Q", len(x)) + x for x in parts)


def unpack(body: bytes, count: int) -> list[bytes]:
    out, pos = [], 0
    for _ in range(count):
        if pos + 8 > len(body):
            raise PsiError("truncated message")
        (n,) = struct.unpack_from("<Q", body, pos)
        pos += 8
        if pos + n > len(body):
            raise PsiError("truncated message")
        out.append(body[pos : pos + n])
        pos += n
    if pos != len(body):
        raise PsiError("trailing bytes after the message")
    return out


class PsiServer:
    """The party that answers: holds its items, a fresh secret key per process, and the mode."""

    def __init__(
        self,
        items: Iterable[str],
        mode: Mode = "intersection",
        fpr: float = DEFAULT_FPR,
        max_client_items: int = 2_000_000,
    ) -> None:
        if mode not in ("intersection", "cardinality"):
            raise PsiError(f"mode must be intersection or cardinality, not {mode!r}")
        if not 0 < fpr < 1:
            raise PsiError(f"fpr must be in (0, 1), got {fpr}")
        self.items = list(dict.fromkeys(items))
        if not self.items:
            raise PsiError("the server needs at least one item")
        self.mode, self.fpr, self.max_client_items = mode, fpr, max_client_items
        self._psi = _psi()
        self._server = self._psi.server.CreateWithNewKey(mode == "intersection")

    def info(self) -> dict[str, Any]:
        return {"mode": self.mode, "fpr": self.fpr, "max_client_items": self.max_client_items, "data_structure": "gcs"}

    def answer(self, request_bytes: bytes) -> bytes:
        """(setup, response), packed: the server's encrypted set sized for this query, and the query
        raised to the server's key."""
        request = self._psi.Request()
        try:
            request.ParseFromString(request_bytes)
        except Exception as e:  # protobuf's DecodeError
            raise PsiError(f"not a PSI request: {e}") from None
        if bool(request.reveal_intersection) != (self.mode == "intersection"):
            raise PsiError(f"this server runs in {self.mode} mode; the request asked for the other mode")
        n = len(request.encrypted_elements)
        if not 0 < n <= self.max_client_items:
            raise PsiError(f"a request must hold 1..{self.max_client_items} items, not {n}")
        setup = self._server.CreateSetupMessage(self.fpr, n, self.items, self._psi.DataStructure.GCS)
        try:
            response = self._server.ProcessRequest(request)
        except RuntimeError as e:  # not points on the curve
            raise PsiError(f"the request's elements are not valid blinded items: {e}") from None
        return pack([setup.SerializeToString(), response.SerializeToString()])


@dataclasses.dataclass
class ClientResult:
    mode: Mode
    client_items: int
    intersection_size: int
    intersection: list[str] | None
    request_bytes: int
    answer_bytes: int


class PsiClient:
    """The party that asks: learns the intersection (or its size) of its items with the server's."""

    def __init__(self, items: Sequence[str], mode: Mode = "intersection") -> None:
        if mode not in ("intersection", "cardinality"):
            raise PsiError(f"mode must be intersection or cardinality, not {mode!r}")
        self.items = list(dict.fromkeys(items))
        if not self.items:
            raise PsiError("the client needs at least one item")
        self.mode = mode
        self._psi = _psi()
        self._client = self._psi.client.CreateWithNewKey(mode == "intersection")

    def request(self) -> bytes:
        return bytes(self._client.CreateRequest(self.items).SerializeToString())

    def finish(self, request_bytes: int, answer: bytes) -> ClientResult:
        setup_b, response_b = unpack(answer, 2)
        setup, response = self._psi.ServerSetup(), self._psi.Response()
        try:
            setup.ParseFromString(setup_b)
            response.ParseFromString(response_b)
        except Exception as e:
            raise PsiError(f"not a PSI answer: {e}") from None
        if self.mode == "intersection":
            idx = sorted(self._client.GetIntersection(setup, response))
            common: list[str] | None = [self.items[i] for i in idx]
            size = len(idx)
        else:
            common, size = None, int(self._client.GetIntersectionSize(setup, response))
        return ClientResult(self.mode, len(self.items), size, common, request_bytes, len(answer))
