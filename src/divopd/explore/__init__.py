"""Explore: the student plays environments (``envs``), the frozen teacher scores every response token (and acts
under +R); ``explorer`` turns rollouts into scored turns."""
