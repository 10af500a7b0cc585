"""Helpers shared by the test modules: servers, processes, data and contract suites."""
