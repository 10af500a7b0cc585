"""numba kernels: the per-report and per-item loops of the estimators.

Compiled functions are cached on disk (``cache=True``), so a second run of a
job does not pay the compilation again. Set ``NUMBA_CACHE_DIR`` to move the
cache (the default is ``__pycache__`` beside each module).

Importing numba and loading the first cached kernel costs a process about half a second, more than
a small job's whole work, so the callers count small batches with numpy and import a kernel module
on their first large batch (:mod:`.support`, :mod:`.counting`, the OUE oracle).
"""
