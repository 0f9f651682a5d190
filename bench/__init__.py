"""Load and latency benchmarks for OwlLayer Server (``python -m bench``).

Every number is measured twice in the same run: against the product and
against a bare Channels echo consumer (``bench.baseline``) served by the same
daphne on the same machine. The report gives the ratio product/baseline, so
a shared, noisy machine changes both sides and the ratio stays readable.
"""
