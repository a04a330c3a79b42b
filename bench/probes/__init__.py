"""One-off measurements behind the figures in docs/scaling.md: run by hand, not part of
`python -m bench.run` (which runs the scenarios and writes bench/results/report.json)."""
