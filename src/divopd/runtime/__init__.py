"""Runtimes: thin shells that run the same Explorer / Trainer code with threads (embedded) or Ray actors."""
