"""The paper benchmark suite (plan, runs, coverage) and the demos built on the library."""
