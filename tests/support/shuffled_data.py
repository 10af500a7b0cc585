"""Shuffled batches for the sink and estimator tests, and their offline estimates.

Batches are made with the real encoders and published as real envelopes
(:mod:`pipeline.envelope`) keyed as the shuffler keys them, so the tests
exercise the same bytes the shuffler would produce.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from estimator.oracles import accumulator_for
from estimator.oracles.base import Accumulator
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.base import MechanismSpec
from ldp_core.wire.frames import ReportBatch
from pipeline.envelope import ShuffleMeta, encode_envelope
from pipeline.topics import metric_day_key
from pipeline.transport import RecordPosition, Transport

__all__ = ["default_specs", "make_batches", "envelope_of", "publish", "offline", "records_of"]


def default_specs() -> dict[str, MechanismSpec]:
    """Three metrics: a packed-bit layout, a hashed one and a one-byte one."""
    return {
        "m_oue": make_spec("oue", epsilon=1.0, domain_size=40),
        "m_olh": make_spec("olh", epsilon=2.0, domain_size=30),
        "m_grr": make_spec("grr", epsilon=1.5, domain_size=6),
    }


def make_batches(
    specs: Mapping[str, MechanismSpec],
    days: Sequence[int],
    count: int,
    rng: np.random.Generator,
    *,
    size: tuple[int, int] = (50, 400),
) -> list[ReportBatch]:
    """``count`` batches cycling through metrics and days, of random sizes in ``size``."""
    names = sorted(specs)
    out = []
    for i in range(count):
        metric = names[i % len(names)]
        spec = specs[metric]
        day = days[(i // len(names)) % len(days)]
        n = int(rng.integers(size[0], size[1] + 1))
        values = rng.integers(0, spec.domain_size, n)
        out.append(ReportBatch(metric, spec, day, spec.encode(values, rng), rng.bytes(16)))
    return out


def envelope_of(batch: ReportBatch, central: float | None = 0.25) -> bytes:
    meta = ShuffleMeta(
        batch.batch_id.hex(),
        len(batch),
        batch.spec.epsilon,
        central,
        None if central is None else 1e-6,
        "test" if central is not None else None,
        3,
    )
    return encode_envelope(meta, batch)


def publish(transport: Transport, topic: str, batches: Sequence[ReportBatch]) -> list[RecordPosition]:
    return transport.publish_many(topic, [(metric_day_key(b.metric, b.day), envelope_of(b)) for b in batches])


def offline(batches: Sequence[ReportBatch]) -> dict[tuple[str, str, int], Accumulator]:
    """The offline estimator's accumulators: every report added once, keyed (metric, spec_id, day)."""
    accs: dict[tuple[str, str, int], Accumulator] = {}
    for b in batches:
        key = (b.metric, b.spec.spec_id, b.day)
        if key not in accs:
            accs[key] = accumulator_for(b.spec)
        accs[key].update(b.records)
    return accs


def records_of(batches: Sequence[ReportBatch], metric: str, day: int) -> list[bytes]:
    """The records of ``metric`` on ``day``, each as bytes, sorted (a multiset to compare)."""
    out = []
    for b in batches:
        if b.metric == metric and b.day == day:
            out.extend(r.tobytes() for r in b.records)
    return sorted(out)
