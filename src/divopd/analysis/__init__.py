"""Analysis over experience logs and run directories: replay, simulate, tune-cap, metrics, the report."""
