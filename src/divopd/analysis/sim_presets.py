"""The synthetic environments of ``divopd simulate``: :class:`Preset` (the distributions of one environment) and
:data:`PRESETS` (ALFWorld-, WebShop- and ScienceWorld-like). How they are used: :mod:`divopd.analysis.simulate`."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRESETS", "Preset"]


@dataclass(frozen=True)
class Preset:
    """Distributions of one synthetic environment, from which :mod:`divopd.analysis.simulate` draws each rollout
    (lengths in tokens, horizons in turns, sigmas log-normal)."""

    name: str  # also the ``env`` column
    step_limit: int  # episode step limit; failed rollouts run to it
    success_rate: float  # probability that a rollout succeeds
    success_median: float  # median horizon of a successful rollout
    success_sigma: float
    min_horizon: int  # shortest successful rollout
    response_median: float  # median response length
    response_sigma: float
    obs_median: float  # median observation length
    obs_sigma: float
    base_prompt: int  # system prompt + task tokens
    context_budget: int  # prompt tokens beyond which the explorer truncates the prompt
    history_window: int | None  # keep only the last this many turns of history in the prompt (None = all)
    student_nll: float  # mean per-token negative log probability of the sampled tokens under the student
    disagreement_median: float  # median per-token disagreement (student − teacher log prob) of a turn
    disagreement_sigma: float
    fail_factor: float  # multiplier of the turn disagreement in failed rollouts
    token_noise: float  # per-token standard deviation around the turn's mean disagreement
    max_delay: int  # explorer ``e`` pulls weights ``e mod (max_delay + 1)`` updates late
    default_rollouts_per_update: float  # R giving an arrival/drain ratio near 2 at B = 256


PRESETS: dict[str, Preset] = {
    # ALFWorld-like: 50-step limit, short observations, full history in a 4k context: late turns of failures truncate.
    "alfworld": Preset(name="alfworld", step_limit=50, success_rate=0.4, success_median=14, success_sigma=0.45,
                       min_horizon=3, response_median=50, response_sigma=0.4, obs_median=30, obs_sigma=0.5,
                       base_prompt=350, context_budget=4096, history_window=None, student_nll=0.35,
                       disagreement_median=0.12, disagreement_sigma=0.8, fail_factor=1.8, token_noise=0.5, max_delay=1,
                       default_rollouts_per_update=14),
    # WebShop-like: 15-step limit, long search-result observations in a 4k context: the last turns of failures truncate.
    "webshop": Preset(name="webshop", step_limit=15, success_rate=0.5, success_median=6, success_sigma=0.35,
                      min_horizon=2, response_median=40, response_sigma=0.4, obs_median=220, obs_sigma=0.35,
                      base_prompt=600, context_budget=4096, history_window=None, student_nll=0.3,
                      disagreement_median=0.15, disagreement_sigma=0.8, fail_factor=1.6, token_noise=0.5, max_delay=1,
                      default_rollouts_per_update=48),
    # ScienceWorld-like: 40-step limit, a 10-turn history window that always fits the 8k context: no truncation.
    "scienceworld": Preset(name="scienceworld", step_limit=40, success_rate=0.35, success_median=18, success_sigma=0.4,
                           min_horizon=5, response_median=35, response_sigma=0.4, obs_median=80, obs_sigma=0.5,
                           base_prompt=700, context_budget=8192, history_window=10, student_nll=0.3,
                           disagreement_median=0.1, disagreement_sigma=0.8, fail_factor=1.5, token_noise=0.4,
                           max_delay=1, default_rollouts_per_update=16),
}
