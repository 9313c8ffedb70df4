"""Runtimes: the adapters (threads, lockstep, ray) that give the one loop its rollouts, weights and evaluation."""
