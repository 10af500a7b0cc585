"""Write the synthetic dataset docs/DPSGD.md trains on (``x``, ``y`` for ``ldp dpsgd``).

Three overlapping Gaussian classes in 10 dimensions, 6000 rows, seed 0:
``.venv/bin/python benchmarks/dpsgd_blobs.py OUT.npz``.
"""

import sys

import numpy as np

rng = np.random.default_rng(0)
n, d, k = 6000, 10, 3
centers = rng.normal(0.0, 0.45, (k, d))
y = rng.integers(0, k, n)
x = centers[y] + rng.normal(0.0, 1.0, (n, d))
np.savez(sys.argv[1], x=x, y=y)
