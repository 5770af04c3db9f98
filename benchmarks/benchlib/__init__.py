"""Helpers of ``benchmarks/bench.py``: timing and pinning (:mod:`.timing`),
the implementations and their correctness checks (:mod:`.impls`) and the
tables and plot (:mod:`.report`). Not part of the installed package."""
