"""The ``ldp`` command line: every service and job of the pipeline, and broker provisioning.

The production entry point (the Docker image runs it). It sits on top of every
other package: :mod:`client_sdk`, :mod:`pipeline`, :mod:`collector`,
:mod:`estimator` and :mod:`simulator`; none of them imports it.
"""

from __future__ import annotations

__all__: list[str] = []
