"""PATE (Private Aggregation of Teacher Ensembles) and semi-private learning.

* :mod:`~estimator.pate.aggregators`: LNMax, GNMax and Confident-GNMax over teacher vote histograms;
* :mod:`~estimator.pate.accounting`: data-independent RDP, the data-dependent analysis of Papernot et
  al. 2018 and the smooth-sensitivity release of the data-dependent ε;
* :mod:`~estimator.pate.experiment`: teachers on disjoint partitions of ``load_digits``, the student on
  the noisily labelled public part, the accuracy–ε trade-off and the DP-SGD comparison (``ldp pate``);
* :mod:`~estimator.pate.federated`: teachers as FL devices whose votes are summed with SecAgg.

Level 6 in the estimator (beside ``service``): the federated teachers use ``estimator.fl``'s SecAgg
server, and the DP-SGD comparison the accountant of ``estimator.accounting``. Nothing is imported here,
so that importing the package stays light.
"""
