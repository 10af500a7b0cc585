"""Scenarios that study federated learning."""
