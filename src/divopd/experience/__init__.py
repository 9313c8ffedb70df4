"""Records and logs: the :class:`Turn` every part exchanges, finished :class:`Rollout` s, the experience log."""

from divopd.experience.turn import Rollout, RolloutInfo, Turn

__all__ = ["Rollout", "RolloutInfo", "Turn"]
