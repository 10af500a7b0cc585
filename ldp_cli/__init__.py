"""The ``ldp`` command line: every service and job of the pipeline, and broker provisioning.

The production entry point (the Docker image runs it). It sits on top of every
other package: :mod:`client_sdk`, :mod:`pipeline`, :mod:`collector`,
:mod:`estimator` and :mod:`simulator`; none of them imports it.

* :mod:`ldp_cli.main` -- the parser and the exit codes (2 with ``ldp <command>: error: ...`` on a
  ``ValueError`` or ``OSError``, which includes every setting and argument error of the project);
* :mod:`ldp_cli.commands` -- one module per sub-command;
* :mod:`ldp_cli.options` -- the options and set-up the workers share (transport, metrics file,
  consumer group and member, logging, stop signals);
* :mod:`ldp_cli.errors` -- the command line's own exceptions;
* :mod:`ldp_cli.broker` -- the project's own single-node Kafka broker (``ldp kafka``).
"""

from __future__ import annotations

__all__: list[str] = []
