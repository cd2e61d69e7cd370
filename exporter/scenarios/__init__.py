"""Scenario files shipped with the package (see docs/design/nvml-sim.md)."""
