"""Homomorphic encryption on the server side (level 5, beside ``fl``): federated averaging under threshold
CKKS compared with SecAgg (:mod:`estimator.he.aggregate`), and private inference on encrypted inputs
(:mod:`estimator.he.inference`). Needs the ``pets`` extra (TenSEAL); docs/HE.md."""
