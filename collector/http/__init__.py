"""The collector's HTTP service."""
