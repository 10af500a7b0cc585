"""The layer every pipeline stage shares.

* :mod:`pipeline.transport` -- the log between stages (:class:`~pipeline.transport.Transport`),
  with an embedded durable implementation and Kafka;
* :mod:`pipeline.topics` -- topic names and keys;
* record formats: :mod:`pipeline.envelope` (shuffled batches), :mod:`pipeline.fl_records`
  (chunked FL documents);
* :mod:`pipeline.catalog` -- the spec catalog read from a metrics file;
* :mod:`pipeline.dataset` -- the Parquet dataset format;
* :mod:`pipeline.prometheus` -- the services' ``GET /metrics`` (on ``prometheus-client``);
* :mod:`pipeline.errors` -- the layer's exceptions.

It imports only :mod:`client_sdk` (and its own dependencies); :mod:`collector` and
:mod:`estimator` import it, never each other.
"""

from __future__ import annotations

__all__: list[str] = []
