"""Federated learning on the server: aggregators and their wrappers (validation,
client-level DP, robust statistics), strategies (FedAvg, FedProx, SCAFFOLD),
client sampling with its accounting, an in-process round loop and the secure
aggregation server (:mod:`estimator.fl.secagg_server`, needs ``cryptography``).

The task file is :mod:`estimator.fl.task` (with :mod:`estimator.fl.options` and
:mod:`estimator.fl.aggregator_specs`); the aggregation job over the pipeline is
:mod:`estimator.fl.job`, which wires :mod:`~estimator.fl.uploads`,
:mod:`~estimator.fl.phases`, :mod:`~estimator.fl.release`,
:mod:`~estimator.fl.privacy` and :mod:`~estimator.fl.status` around its
checkpoints (:mod:`estimator.fl.checkpoint`)."""
