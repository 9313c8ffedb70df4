"""The registry of ``metrics.jsonl`` keys: the metrics reference page is generated from it and a test checks it
against the keys a real training run writes, so a new key needs a row here."""

from __future__ import annotations

__all__ = ["METRIC_KEYS"]

#: ``(key, record kind: update, eval or both, meaning)``; ``<name>`` stands for a family of keys.
METRIC_KEYS: list[tuple[str, str, str]] = [
    ("kind", "both", "`\"update\"` (one record per learner update) or `\"eval\"` (one per evaluation)."),
    ("update", "both", "Learner version after the step (update records) or of the evaluated snapshot (eval records)."),
    ("time", "both", "Seconds since the run started (continued across `--resume`)."),
    ("learner/loss", "update", "OPD loss of the batch (`divopd.learn.loss.opd_loss`, Equation 1)."),
    ("learner/reverse_kl", "update",
     "Mean of log π_θold − log π_T over valid tokens: the sampled reverse-KL estimate."),
    ("learner/topk_reverse_kl", "update", "Top-k reverse KL (only with `learner.estimator: topk`)."),
    ("learner/valid_tokens", "update", "Tokens that entered the loss (action ∧ teacher-valid ∧ finite)."),
    ("learner/dead_rows", "update", "Rows without a valid token (they stay in the loss denominator)."),
    ("learner/rows", "update", "Rows of the batch (B)."),
    ("learner/clip_frac", "update",
     "Share of valid tokens where the PPO clip was active (0 with one update per batch)."),
    ("learner/ratio_mean", "update", "Mean π_θ/π_θold over valid tokens (1 with one update per batch)."),
    ("learner/dropped_nonfinite", "update", "Positions dropped from the mask because a log prob was not finite."),
    ("learner/grad_norm", "update", "Global gradient L2 norm before clipping."),
    ("learner/tokens", "update", "Prompt + response tokens processed by this update."),
    ("learner/tokens_total", "both", "Cumulative learner tokens (the x axis of tokens-to-τ)."),
    ("learner/input_slots", "update", "Input slots of the forward pass, padding included."),
    ("learner/compute_s", "update", "Wall seconds inside `Learner.step` (the CPU stand-in for trainer GPU-hours)."),
    ("learner/compute_s_total", "both", "Cumulative learner compute seconds (the x axis of compute-to-τ)."),
    ("learner/version", "update", "Learner version after the step."),
    ("time/publish_s", "update", "Wall seconds to make this version's weight handle for the explorers (a sharded "
     "learner: rank 0 gathers the full state dict), once per version."),
    ("time/wait_s", "update", "Wall seconds the loop spent in the runtime's `poll` and waiting for rollouts since the "
     "previous update (lockstep: the explorers' stepping itself, which runs inside `poll`); a long wait is where a "
     "run stalls (`runtime.stall_timeout_s`)."),
    ("time/compose_s", "update", "Wall seconds composing batches since the previous update (the sampler's rule, "
     "attempts that found too few valid turns included)."),
    ("time/update_s", "update", "Wall seconds of this update's learner step (and its Appendix E diagnostics when "
     "`diagnostics.every` is set), measured around `Learner.step`."),
    ("time/generate_s", "update", "Explorer seconds in generation (student, and the teacher acting under +R), summed "
     "over the rollouts (or chunks) that arrived since the previous update; each reports its explorer's time since "
     "it handed over the one before, so over a run the sum is the explorers' whole generation time (in parallel "
     "explorers: more than the wall time)."),
    ("time/env_s", "update", "Explorer seconds in environment steps, summed like `time/generate_s`."),
    ("time/score_s", "update", "Explorer seconds in teacher scoring (`teacher.backend`, or the shared Ray teacher), "
     "summed like `time/generate_s`."),
    ("time/weight_load_s", "update", "Seconds the newest weight version took to load into an explorer's generator "
     "(HF `load_state_dict`, or the push into a vLLM engine: `explorer.generation.backend: vllm`), as reported by "
     "the rollouts that arrived so far; 0 before the first load."),
    ("learner/truncated_prompts", "update", "Rows whose prompt the learner left-truncated (`learner.max_prompt_len`)."),
    ("learner/skipped_update", "update", "1 when a non-finite gradient norm skipped the optimizer step."),
    ("learner/lr", "update", "Learning rate of the step."),
    ("learner/time_forward_backward_s", "update", "Seconds of forward + loss + backward."),
    ("learner/time_optimizer_s", "update", "Seconds of clipping + the AdamW step."),
    ("learner/time_other_s", "update", "The rest of the step (building rows and inputs)."),
    ("learner/row_weight_min", "update", "Smallest per-row loss weight (only when rows are weighted: divopd-focus's "
     "task balance, TurnOPD's schedule; absent = unit weights, the paper's loss)."),
    ("learner/row_weight_max", "update", "Largest per-row loss weight (only when rows are weighted)."),
    ("learner/turn_balance_alpha", "update", "TurnOPD: α of the token-level (0) to turn-balanced (1) loss schedule "
     "at this update (only with `learner.turn_balance_updates`)."),
    ("sampler/rows", "update", "Rows of the batch (B)."),
    ("sampler/distinct_rollouts", "update", "Rollouts in the batch."),
    ("sampler/effective_rollouts", "update", "1/Σ_r p_r², p_r = rollout r's share of the batch's response tokens."),
    ("sampler/max_rollout_share", "update", "max_r p_r: the largest rollout's token share."),
    ("sampler/dead_rows", "update",
     "Selected rows with no valid token (only the ungated rules `vanilla` and `divopd-focus`)."),
    ("sampler/response_tokens", "update", "Response tokens of the batch."),
    ("sampler/valid_tokens", "update", "Valid tokens of the batch."),
    ("sampler/mean_staleness", "update",
     "Mean learner version − generating version over rows (Table 12's mean age of consumed rows)."),
    ("sampler/max_staleness", "update", "Largest staleness of a row."),
    ("sampler/version_min", "update", "Oldest generating policy version in the batch."),
    ("sampler/version_max", "update", "Newest generating policy version in the batch."),
    ("sampler/version_mean", "update", "Mean generating policy version."),
    ("sampler/disagreement_mean", "update", "Mean focus score s(u) of the rows."),
    ("sampler/disagreement_std_across_rollouts", "update",
     "Std of each rollout's summed focus score in the batch (the paper's Figure 6 statistic)."),
    ("sampler/turns_per_rollout", "update",
     "Table 9: rows ÷ distinct rollouts of the batch (`paper_diagnostics.turns_per_rollout`)."),
    ("sampler/kl_per_token", "update", "Table 9: Σ(generating student − teacher log prob) ÷ tokens, over the batch's "
     "valid tokens with a finite student log prob (`paper_diagnostics.kl_per_token`; `learner/reverse_kl` is the same "
     "mean under the learner's log π_θold)."),
    ("sampler/scored_tokens_received", "update",
     "Table 16: teacher-scored response tokens (finite teacher log prob) of every turn received so far."),
    ("sampler/response_tokens_trained", "update", "Table 16: response tokens of every batch trained so far."),
    ("sampler/teacher_tokens_per_trained_token", "update",
     "Table 16: `scored_tokens_received` ÷ `response_tokens_trained` (cumulative)."),
    ("sampler/disagreement_std_ema", "update",
     "Figure 6: EMA (α = 0.12, first value = the first update's) of `disagreement_std_across_rollouts`."),
    ("sampler/expired", "update", "Turns expired during this composition."),
    ("sampler/invalid", "update", "Turns the gate rejected during this composition."),
    ("sampler/pending", "update", "Unselected valid turns kept pending after this composition."),
    ("sampler/queued", "update", "Turns still in the queue after this composition."),
    ("sampler/candidates", "update", "Pool size the method chose from."),
    ("sampler/teacher_masked_tokens", "update", "Framework plug-ins only (Trinity-RFT's and verl's metrics, not "
     "metrics.jsonl): action positions of the batch the teacher did not score (NaN or infinite log prob), taken out "
     "of the framework's mask (Trinity's `action_mask`, verl's `response_mask` / `loss_mask`) with a finite "
     "placeholder before the framework's advantage or loss sees them."),
    ("sampler/arrival_ratio", "update", "Framework plug-ins only: turns that arrived since the previous step ÷ B "
     "(turns generated and teacher-scored per trained turn; the dispatch target is `target_arrival_ratio`, 2.0 by "
     "default; below 1 the composer is starved)."),
    ("sampler/sessions_started", "update", "Framework plug-ins only: rollout sessions started at this step (verl: by "
     "the DivOPD buffer's dispatch; Trinity-RFT: sessions whose turns arrived, the explorer starts them)."),
    ("sampler/turns_per_session", "update", "Framework plug-ins only: running mean of turns per session that came "
     "back (before the first one: half the env's horizon), the m of the dispatch rule."),
    ("sampler/expired_share", "update", "Framework plug-ins only: turns expired at this step ÷ turns that arrived "
     "since the previous step (about 1 − 1/ρ at an arrival ratio ρ with a pooled rule)."),
    ("sampler/candidate_rollouts", "update", "Distinct rollouts among the valid candidates (the paper's pool regime: "
     "≥ 4·⌈B/k⌉ on average)."),
    ("ledger/received", "update", "Turns received so far (= selected + expired + invalid + pending + queued)."),
    ("ledger/selected", "update", "Turns selected into a batch so far."),
    ("ledger/expired", "update", "Turns expired so far (stale, pending_age, or pending overflow)."),
    ("ledger/invalid", "update", "Turns the gate rejected so far."),
    ("ledger/pending", "update", "Valid turns waiting in the pending pool."),
    ("ledger/queued", "update", "Turns in the queue, not yet read into a pool."),
    ("ledger/invalid/<reason>", "update", "Rejections per gate code (`prompt_truncated`, `empty_response`, "
     "`missing_teacher`, `missing_student_logprobs`, `length_mismatch`, `no_valid_token`)."),
    ("ledger/expired/<reason>", "update", "Expiries per reason (`stale`, `pending_age` (W, Algorithm 1 step 8), "
     "`pending_overflow`)."),
    ("queue/arrivals", "update", "Turns that arrived since the previous update."),
    ("queue/arrival_drain_ratio", "update", "Turns received ÷ (updates taken × B), over the run so far (≥ 1 "
     "whenever the learner had to wait for turns)."),
    ("queue/producer_load", "update", "Lockstep only: turns received per learner-step interval of production (one "
     "poll of `runtime.lockstep.env_steps_per_update` steps) ÷ B, over the run so far: the paper's Table 2 ratio, "
     "below 1 when the learner waits."),
    ("explorer/rollouts", "update", "Rollouts received so far."),
    ("explorer/turns", "update", "Student turns received so far."),
    ("explorer/success_rate_train", "update", "Share of received training rollouts that succeeded."),
    ("explorer/teacher_turns", "update", "Teacher-acted turns so far (+R recovery; never queued)."),
    ("explorer/teacher_masked_tokens", "update", "Response tokens received so far whose teacher log prob is not "
     "finite, so not teacher-valid: a student token the teacher's vocabulary lacks, a cross-tokenizer span that "
     "could not be mapped (docs/concepts/teacher-vocabularies.md), a first token without context."),
    # diagnostics (Appendix E, with diagnostics.every > 0)
    ("diag/grad_cos_pool", "update",
     "E.3: cosine of the batch's OPD gradient with the gradient of all valid candidates."),
    ("diag/grad_proj_pool", "update", "E.3: projection of the batch gradient onto the pool gradient."),
    ("diag/grad_pairwise_cos", "update", "E.3: mean pairwise cosine of per-row gradients."),
    ("diag/grad_norm_batch", "update", "E.3: norm of the batch gradient."),
    ("diag/grad_norm_pool", "update", "E.3: norm of the pool gradient."),
    ("diag/grad_rows", "update", "E.3: rows with per-row gradients (at most `diagnostics.max_rows`)."),
    ("diag/grad_pool_turns", "update", "E.3: candidate turns in the pool gradient."),
    ("diag/focus_spearman", "update",
     "E.2: Spearman correlation of cached focus scores with scores recomputed under the current learner."),
    ("diag/focus_spearman_within_rollout", "update", "E.2: the same correlation within rollouts."),
    ("diag/focus_mean_abs_change", "update", "E.2: mean absolute change of the focus score."),
    ("diag/focus_turns", "update", "E.2: candidate turns rescored."),
    ("diag/focus_rollouts", "update", "E.2: rollouts among them."),
    ("eval/success_rate", "eval", "Share of held-out episodes won (0–1; `divopd report` shows percent)."),
    ("eval/mean_score", "eval", "Mean final environment score (0–1)."),
    ("eval/mean_steps", "eval", "Mean episode length."),
    ("eval/episodes", "eval", "Episodes evaluated."),
    ("eval/crashed", "eval", "Episodes ended by an environment crash."),
    ("eval/policy_version", "eval", "Student version evaluated."),
    ("eval/seconds", "eval", "Wall seconds of the evaluation."),
]
