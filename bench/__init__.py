"""Benchmarks and the audit seeder: not shipped with the hub (``make bench``, or ``python -m bench NAME``)."""
