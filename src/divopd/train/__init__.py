"""Train: the one Algorithm-1 loop (``loop``), the trainer it drives, the run config, runtimes (threads, lockstep,
Ray) as adapters, Ctrl-C handling and checkpoint evaluation.

``from divopd.train import train`` runs (or resumes) one training run.
"""

from divopd.train.run import train

__all__ = ["train"]
