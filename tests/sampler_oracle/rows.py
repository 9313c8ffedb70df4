# ruff: noqa
"""The previous sampler's rows module, kept as the test oracle (docstrings dropped)."""
from __future__ import annotations
from sampler_oracle.focus import compose_divopd_focus, task_balance_weights
from sampler_oracle.methods import compose_focus_first, compose_oldest, rollout_first, rollout_first_select, select_focus_first, select_oldest
from sampler_oracle.registry import METHODS, Method
_ALL = ('paper', 'coverage', 'replay', 'demo-replay')

def _row(name: str, sampler: Method, description: str, tags: tuple[str, ...]=(), switches: tuple=()) -> None:
    METHODS.setdefault(sampler.name, sampler)

def _rollout_first_rule(name: str, within: str, capped: bool, description: str) -> Method:
    return Method(name, rollout_first(within, capped), True, description, rollout_first_select(within, capped))
VANILLA = Method('vanilla', None, False, 'arrival-order reader: next B non-stale turns, no gate')
DIVOPD = _rollout_first_rule('divopd', 'focus', True, 'pool + gate + rollout-first cap k, focus within')
_row('vanilla', VANILLA, 'arrival-order reader: the next B non-stale turns, no gate', _ALL)
_row('vanilla-pool', Method('vanilla-pool', compose_oldest, True, 'pool + gate, then the B oldest turns by arrival', select_oldest), 'pool + gate, then the B oldest turns by arrival', ('paper', 'demo-replay'))
_row('nocap', _rollout_first_rule('nocap', 'uniform', False, 'pool + gate + rollout-first, k=∞, uniform within'), 'pool + gate + rollout-first, k = ∞, uniform within', ('paper', 'coverage', 'demo-replay'))
_row('divopd-base', _rollout_first_rule('divopd-base', 'uniform', True, 'pool + gate + rollout-first cap k, uniform within'), 'pool + gate + rollout-first cap k, uniform within', _ALL)
_row('divopd', DIVOPD, 'pool + gate + rollout-first cap k, focus within', _ALL)
_row('divopd-focus', Method('divopd-focus', compose_divopd_focus, True, 'earlier composer: pool, no gate, task groups in seeded random order, 3-turn / 25%-token first pass, task-balance row weights', gated=False, row_weights=task_balance_weights), 'earlier composer: no gate, task groups in seeded random order, 3-turn / 25%-token first pass, task-balance row weights', ('paper',))
_row('top-b', Method('top-b', compose_focus_first, True, 'pool + gate + Top-B: all valid turns ranked by disagreement, no per-rollout limit', select_focus_first), 'pool + gate + Top-B: all valid turns ranked by disagreement, no per-rollout limit', ('paper',))
_row('divopd-r', DIVOPD, 'DivOPD + teacher recovery (+R) in no-progress rollouts', ('paper',), ())
_row('tcod-f2b', VANILLA, 'arrival-order reader + TCOD-F2B rollout-depth curriculum', ('paper',), ())
_row('turnopd', VANILLA, 'arrival-order reader + TurnOPD adaptive depth budget + token-to-turn loss schedule', ('paper',), ())
