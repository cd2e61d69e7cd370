"""Benchmarks (not tests); a package so that bench/exporter.py is not mistaken for the exporter package."""
