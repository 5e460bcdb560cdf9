"""The speed, memory and start-up benchmarks, run as scripts (``python benchmarks/throughput.py``); a package so that
the tests import them from here, not from a top-level ``benchmarks`` package another distribution installs (Opacus
ships one)."""
