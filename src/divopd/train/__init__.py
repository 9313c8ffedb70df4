"""Train: the one Algorithm-1 loop, its trainer, the run config, runtimes as adapters; :func:`train` runs one run."""

from divopd.train.run import train

__all__ = ["train"]
