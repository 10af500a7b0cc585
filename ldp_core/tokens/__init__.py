"""Anonymous tokens: blind RSA (RFC 9474), Privacy Pass (RFC 9578) and device enrollment."""
