"""The wire format: framing, report frames, and sealing to the analyzer (HPKE)."""
