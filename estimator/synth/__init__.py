"""Differentially private synthetic data (issue 32): tables whose records come from a model fitted to noisy
statistics, never from the records themselves.

* :mod:`.data` - the categorical table, the seeded population the evaluations use, marginals.
* :mod:`.zcdp` - ρ-zCDP and its conversion to (ε, δ); the budget of the marginal methods.
* :mod:`.marginal` - MST and AIM (McKenna et al. 2021, 2022) on the ``mbi`` package's estimation.
* :mod:`.dpgan` - a DP-GAN: DP-SGD on the discriminator only, the generator trained through it.
* :mod:`.telemetry` - synthetic telemetry: a table from 2-way marginals collected under *local* DP.
* :mod:`.evaluate` - fidelity (1/2/3-way marginal error, downstream accuracy) and memorisation.

Importing this package loads nothing heavy; ``mbi`` (and with it ``jax``) is imported by the functions that
need it (the ``synth`` extra)."""
