"""The Parquet dataset format: reports partitioned by metric and day.

Layout of a dataset rooted at ``root``::

    metric=<name>/day=<N>/part-<topic>-<partition>-<first>-<last>-<spec_id>.parquet

``N`` is the UTC day number (days since 1970-01-01). A file holds the
reports of one metric, day and spec taken from one *chunk*: the records
(shuffled batches) of one topic partition with offsets ``first..last``
(20-digit zero-padded). Columns mirror the spec's record layout: integer
fields as integer columns of the same width and signedness, packed-bit
(sub-array) fields as ``fixed_size_binary`` of the field's byte width, in
the wire's byte order; plus a dictionary-encoded ``spec_id`` column. The
file's schema metadata holds ``ldp.format`` (:data:`FORMAT`), ``ldp.spec``
(the spec dict, so a file is readable without any metrics file),
``ldp.spec_id``, ``ldp.metric``, ``ldp.day``, ``ldp.source`` (topic,
partition, first, last) and ``ldp.shuffles`` (the shuffle metadata of every
batch in the file, with its offset).

Files are complete or absent (written under a temporary name and renamed),
so a reader that lists the folders sees each report once. The writer is
:class:`collector.sinks.parquet.ParquetSink`; the readers are the batch
estimation jobs (:mod:`estimator.jobs.batch`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ldp_core.errors import FrameError
from ldp_core.files import fsync_dir, makedirs_durable, write_atomic
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.base import ReportSpec
from pipeline.errors import DatasetError

__all__ = [
    "FORMAT",
    "DatasetError",
    "PartFile",
    "PartData",
    "records_to_table",
    "table_to_records",
    "part_name",
    "parse_part_name",
    "write_table_atomic",
    "read_part_spec",
    "fsync_dir",
    "makedirs_durable",
    "list_parts",
    "read_part",
]

FORMAT = "ldp-parquet/1"

_PART_RE = re.compile(
    r"^part-(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>\d+)-(?P<first>\d{20})-(?P<last>\d{20})-"
    r"(?P<spec_id>[0-9a-f]{16})\.parquet$"
)


# -- records <-> Arrow ---------------------------------------------------------------------------


def records_to_table(records: np.ndarray, spec: ReportSpec) -> pa.Table:
    """An Arrow table whose columns mirror ``spec.record_dtype``, plus ``spec_id``."""
    dtype = spec.record_dtype
    if records.dtype != dtype:
        raise FrameError(f"records have dtype {records.dtype}, spec {spec.name} ({spec.spec_id}) needs {dtype}")
    n = int(records.size)
    arrays, names = [], []
    for name in dtype.names or ():
        ftype = dtype.fields[name][0]  # type: ignore[index]  # a structured dtype: fields is set
        col = records[name]
        if ftype.subdtype is not None:
            raw = np.ascontiguousarray(col).view(np.uint8).reshape(-1)
            arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(ftype.itemsize), n, [None, pa.py_buffer(raw)])
        else:
            arr = pa.array(np.ascontiguousarray(col, dtype=ftype.newbyteorder("=")))
        arrays.append(arr)
        names.append(name)
    arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([spec.spec_id])))
    names.append("spec_id")
    return pa.Table.from_arrays(arrays, names=names)


def table_to_records(table: pa.Table, spec: ReportSpec) -> np.ndarray:
    """Inverse of :func:`records_to_table`; checks the columns against the spec's layout."""
    dtype = spec.record_dtype
    n = table.num_rows
    out = np.empty(n, dtype=dtype)
    for name in dtype.names or ():
        if name not in table.column_names:
            raise DatasetError(
                f"column {name!r} of spec {spec.name} ({spec.spec_id}) is missing; the file has {table.column_names}"
            )
        ftype = dtype.fields[name][0]  # type: ignore[index]  # a structured dtype: fields is set
        col = table.column(name).combine_chunks()
        if ftype.subdtype is not None:
            if col.type != pa.binary(ftype.itemsize):
                raise DatasetError(f"column {name!r} is {col.type}, expected fixed_size_binary[{ftype.itemsize}]")
            if n:
                data = np.frombuffer(
                    col.buffers()[1], dtype=np.uint8, count=n * ftype.itemsize, offset=col.offset * ftype.itemsize
                )
                out[name] = data.view(ftype.base).reshape((n, *ftype.shape))
        else:
            if col.type != pa.from_numpy_dtype(ftype.newbyteorder("=")):
                raise DatasetError(f"column {name!r} is {col.type}, expected {ftype}")
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


# -- names and durable files -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartFile:
    """A data file of the dataset, described by its path and name."""

    path: Path
    metric: str
    day: int
    topic: str
    partition: int
    first: int
    last: int
    spec_id: str


def part_name(topic: str, partition: int, first: int, last: int, spec_id: str) -> str:
    """``part-<topic>-<partition>-<first>-<last>-<spec_id>.parquet`` (offsets zero-padded to 20 digits)."""
    return f"part-{topic}-{partition}-{first:020d}-{last:020d}-{spec_id}.parquet"


def parse_part_name(name: str) -> dict[str, Any] | None:
    """The fields of a part file name, or ``None`` if ``name`` is not one."""
    m = _PART_RE.match(name)
    if m is None:
        return None
    return {
        "topic": m["topic"],
        "partition": int(m["partition"]),
        "first": int(m["first"]),
        "last": int(m["last"]),
        "spec_id": m["spec_id"],
    }


def write_table_atomic(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` (creating its folders) atomically and durably, with
    :func:`ldp_core.files.write_atomic`: temp name, fsync, rename, fsync folder."""
    makedirs_durable(path.parent)
    write_atomic(path, lambda f: pq.write_table(table, f, compression="zstd"))


# -- reading -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartData:
    """The content of one part file."""

    file: PartFile
    spec: ReportSpec
    records: np.ndarray
    shuffles: list[dict[str, Any]]


def list_parts(root: str | os.PathLike[str], metric: str, days: Iterable[int] | None = None) -> list[PartFile]:
    """The part files of ``metric`` (for ``days`` if given), sorted by day, topic, partition and offset."""
    base = Path(root) / f"metric={metric}"
    wanted = None if days is None else set(int(d) for d in days)
    out: list[PartFile] = []
    if not base.is_dir():
        return out
    for day_dir in base.iterdir():
        if not day_dir.is_dir() or not day_dir.name.startswith("day="):
            continue
        try:
            day = int(day_dir.name[4:])
        except ValueError:
            continue
        if wanted is not None and day not in wanted:
            continue
        for f in day_dir.iterdir():
            fields = parse_part_name(f.name)
            if fields is not None:
                out.append(PartFile(path=f, metric=metric, day=day, **fields))
    out.sort(key=lambda p: (p.day, p.topic, p.partition, p.first, p.spec_id))
    return out


def read_part_spec(part: PartFile | str | os.PathLike[str]) -> ReportSpec:
    """The spec of a part file, from its schema metadata only (no record is read)."""
    path = part.path if isinstance(part, PartFile) else Path(part)
    md = pq.read_schema(path).metadata or {}
    if md.get(b"ldp.format") != FORMAT.encode() or b"ldp.spec" not in md:
        raise DatasetError(f"{path} is not an ldp-parquet part file (format {md.get(b'ldp.format')!r})")
    return spec_from_dict(json.loads(md[b"ldp.spec"]))


def read_part(part: PartFile | str | os.PathLike[str]) -> PartData:
    """Read a part file; its spec comes from the file's own metadata."""
    if not isinstance(part, PartFile):
        path = Path(part)
        fields = parse_part_name(path.name)
        if fields is None:
            raise DatasetError(f"{path} is not named like a part file (part-<topic>-<p>-<first>-<last>-<spec>.parquet)")
        md = pq.read_schema(path).metadata or {}
        part = PartFile(
            path=path, metric=md.get(b"ldp.metric", b"").decode(), day=int(md.get(b"ldp.day", b"0")), **fields
        )
    table = pq.read_table(part.path)
    md = table.schema.metadata or {}
    if md.get(b"ldp.format") != FORMAT.encode():
        raise DatasetError(f"{part.path} is not an ldp-parquet part file (format {md.get(b'ldp.format')!r})")
    spec = spec_from_dict(json.loads(md[b"ldp.spec"]))
    if part.spec_id != spec.spec_id or md.get(b"ldp.spec_id", b"").decode() != spec.spec_id:
        raise DatasetError(f"{part.path}: its metadata's spec has id {spec.spec_id}, its name says {part.spec_id}")
    return PartData(part, spec, table_to_records(table, spec), json.loads(md.get(b"ldp.shuffles", b"[]")))
