"""The sampler as it was before candidates were kept as columns (list composers, per-rule selectors), kept verbatim
as a test oracle: tests/test_sampler_oracle.py holds the current sampler to it, update by update."""
