"""Explore: the student plays environments, the frozen teacher scores every response token (and acts under +R).

``explorer`` (the spine: rollouts → scored turns), ``generation`` (backends), ``prompting``, ``recovery`` (+R),
``tcod`` (TCOD-F2B horizons), ``envs`` (the environment registry).
"""
