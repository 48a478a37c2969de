"""Benchmark harness for xfer: topologies, reference tools, measurements and reports."""
