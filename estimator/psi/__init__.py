"""Private set intersection between two organisations over HTTP (OpenMined's PSI: ECDH-PSI on P-256 with
a Golomb-compressed set, or a Bloom filter, for the server's side). :mod:`estimator.psi.protocol` holds
the two parties, :mod:`estimator.psi.http` the service and its client. Needs the ``pets`` extra;
docs/PSI.md."""
