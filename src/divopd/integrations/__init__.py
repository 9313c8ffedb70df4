"""Plug-ins that put divopd's batch composer inside other RL trainers (each needs its framework installed)."""
