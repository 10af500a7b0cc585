"""Prio3: exact aggregates by two non-colluding aggregators (docs/PRIO3.md)."""
