"""The reproduction benchmark: the MOON paper's comparisons rerun through NVFlare's real simulator.

``python -m nvflare_moon.benchmark --protocol quick`` (see :mod:`.cli` and ``docs/benchmark.md``). The parts:
:mod:`.protocols` (what to run, as data), :mod:`.methods` (how to start each method), :mod:`.runner` (run, watch,
record, resume), :mod:`.collect` (read what a run logged), :mod:`.tables` (the derived tables), :mod:`.plots` and
:mod:`.summary` (the report), :mod:`.published` (the papers' numbers).

Needs the ``benchmark`` extra: ``pip install "nvflare-moon[benchmark]"`` (matplotlib, psutil).
"""
