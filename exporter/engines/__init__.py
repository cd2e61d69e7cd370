"""Inference-engine metrics: discovery, concurrent scraping and per-engine normalization."""
