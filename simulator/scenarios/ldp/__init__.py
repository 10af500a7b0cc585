"""Scenarios that study the local-DP telemetry pipeline."""
