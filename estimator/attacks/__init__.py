"""Attacks on the models the jobs train (docs/ATTACKS.md): membership inference (shadow models, LiRA) with
the empirical ε lower bound, model inversion, gradient inversion (DLG) and DP-SGD's accuracy per group.

One level above ``jobs`` in ``estimator``: the attacks train and probe the jobs' models."""
