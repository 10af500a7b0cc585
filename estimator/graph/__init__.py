"""Graph DP: node-level and edge-level differentially private training of a graph neural network.

A simplified graph convolution (SGC, Wu et al. 2019) with mean aggregation over each node's closed
neighbourhood, K hops, then a softmax classifier on the aggregated features, trained by full-batch
DP-SGD with per-node gradient clipping on a graph whose degree is bounded by D. One node appears in at
most N(D, K) = 1 + D + ... + D^K computation trees, so the gradient sum's node-level sensitivity is
inflated by that factor (:mod:`estimator.graph.sensitivity`); an edge reaches fewer trees
(2·N(D, K-1)). :mod:`estimator.graph.data` makes the graphs (a seeded stochastic block model) and bounds
their degree; :mod:`estimator.graph.train` trains, calibrates the noise to a target ε and measures the
utility gap between the two levels. docs/GRAPH.md has the tables.
"""
