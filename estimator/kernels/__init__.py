"""numba kernels: the per-report and per-item loops of the estimators.

Compiled functions are cached on disk (``cache=True``), so a second run of a
job does not pay the compilation again. Set ``NUMBA_CACHE_DIR`` to move the
cache (the default is ``__pycache__`` beside each module).
"""
