"""Private model selection: choosing among candidate configurations scored on private data.

* :mod:`estimator.selection.mechanisms`: the sparse vector technique run one candidate at a time
  (:class:`~estimator.selection.mechanisms.AboveThreshold`, paying only for above-threshold answers), the
  exponential mechanism (report-noisy-max with Gumbel noise) and the cost of the naive approach (every
  candidate's noisy score released, composed over all candidates).
* :mod:`estimator.selection.dpsgd`: ``ldp dpsgd --select``: candidate noise multipliers, learning rates and
  clipping norms trained with DP-SGD and scored on a private validation split, with the selection's ε composed
  into the run's total.

Level 6 of the estimator (above ``jobs`` and ``fl``, whose runs it scores; below ``service``).
"""
