"""One module per scenario; each `run(ctx)` returns the scenario's JSON-ready results."""
