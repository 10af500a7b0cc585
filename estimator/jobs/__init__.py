"""Batch jobs over a Parquet dataset: frequency, numeric, heavy hitters, locally or on Spark; central DP-SGD."""
