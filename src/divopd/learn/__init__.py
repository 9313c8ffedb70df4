"""Learn: the OPD loss, the learner's one optimizer step per batch, checkpoints, Appendix E diagnostics, SFT."""
