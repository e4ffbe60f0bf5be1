"""livefit's benchmark suite: ``python -m bench [--quick] [--only NAME] [--soak]``.

Each benchmark compares livefit with what a user would otherwise run, side by side in one run,
and records medians, spreads and ratios with the machine's facts in ``bench/results/*.json``;
``BENCHMARKS.md`` is generated from that JSON. See BENCHMARKS.md for the figures.
"""
