"""Federated learning on the server: aggregators and their wrappers (validation,
client-level DP, robust statistics), strategies (FedAvg, FedProx, SCAFFOLD),
client sampling with its accounting, an in-process round loop and the secure
aggregation server (:mod:`estimator.fl.secagg_server`, needs ``cryptography``)."""
