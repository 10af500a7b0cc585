"""``ldp demo``'s work, apart from its command line (:mod:`ldp_cli.commands.demo`).

* :mod:`simulator.demo.pipeline`: the whole pipeline on one machine (:class:`~simulator.stack.LocalPipeline`)
  fed by simulated devices, optionally with sealed metrics or anonymous upload tokens, and its check that
  every report was counted once and that the streaming estimates equal the batch job's;
* :mod:`simulator.demo.rows`: each metric's estimates set against the devices' truth (printed, and the
  ``demo.json`` entry);
* :mod:`simulator.demo.tokens`: the ``--tokens`` run's flooding install and its issued/spent/refused tally;
* :mod:`simulator.demo.offline`: the in-memory simulation of every frequency oracle (``--offline``);
* :mod:`simulator.demo.plots`: the ``demo.png`` of both.
"""
