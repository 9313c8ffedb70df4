"""Loaded by Trinity-RFT from ``--plugin-dir``: registers ``divopd`` in Trinity's SAMPLE_STRATEGY registry."""

from divopd.integrations.trinity import STRATEGY_NAME, DivOPDSampleStrategy

__all__ = ["STRATEGY_NAME", "DivOPDSampleStrategy"]
