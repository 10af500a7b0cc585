"""What devices and servers agree on: errors, canonical form, hashing, randomness, noise, privacy
events, mechanisms, metrics files, the wire format, tokens and the shared half of federated learning.

Every other package imports this one; it imports none of them. It needs only numpy and xxhash
(``ldp_core.wire.hpke`` and the token modules also need ``cryptography``)."""
