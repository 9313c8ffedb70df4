"""The composer inside other trainers: DivOPD's batch selection as a plug-in of Trinity-RFT
(:mod:`divopd.integrations.trinity`) or verl (:mod:`divopd.integrations.verl`). This package imports no framework:
``import divopd.integrations`` costs nothing and needs none installed.
"""
