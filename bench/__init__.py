"""The benchmark suite of the Acurio analysis queue: `python -m bench.run [--quick]` (see README.md)."""
