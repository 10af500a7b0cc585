"""Scenarios that reproduce published set-ups with seeded synthetic data."""
