"""The composer inside other trainers: DivOPD's batch selection as a plug-in of an existing RL framework.

One module per framework: :mod:`divopd.integrations.trinity` (Trinity-RFT) and :mod:`divopd.integrations.verl`
(verl). Each turns the framework's per-turn records into :class:`divopd.Turn` s, keeps divopd's own
:class:`divopd.sampling.Sampler` (queue, pending pool, ledger) across the framework's steps and hands back the
framework's records in the order the rule chose them. A module here imports only :mod:`divopd.sampling`,
:mod:`divopd.experience`, :mod:`divopd.errors` and its framework, and this package imports none of them:
``import divopd.integrations`` costs nothing and needs no framework installed.
"""
