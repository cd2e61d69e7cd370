"""Benign fleets: nothing breaks; what fires anyway (issue 40). See bench/benign_fleet.py."""
