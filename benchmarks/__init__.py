"""Throughput and latency measurements."""
