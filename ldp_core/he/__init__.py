"""Homomorphic encryption shared by devices and servers: threshold CKKS (:mod:`ldp_core.he.threshold`).

Needs the ``pets`` extra (TenSEAL, which bundles Microsoft SEAL); importing :mod:`ldp_core` does not import it.
"""
