"""Loaded by Trinity-RFT from ``--plugin-dir``: registers divopd's per-turn OPD workflows (``divopd_opd_workflow``,
``divopd_alfworld_workflow``, ``divopd_scienceworld_workflow``, ``divopd_webshop_workflow``) in Trinity's WORKFLOWS."""

from divopd.integrations.trinity_workflow import WORKFLOW_NAMES, DivOPDWorkflow

__all__ = ["WORKFLOW_NAMES", "DivOPDWorkflow"]
