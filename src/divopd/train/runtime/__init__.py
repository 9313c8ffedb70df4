"""Runtimes: adapters that give the one loop (:mod:`divopd.train.loop`) its rollouts, weight publication and
evaluation — ``threads`` (explorer threads), ``lockstep`` (one thread, deterministic) and ``ray`` (actors)."""
