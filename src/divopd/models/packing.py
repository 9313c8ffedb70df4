"""(prompt, response) rows as causal-LM inputs in one of two :data:`LAYOUTS` (the same result up to float rounding), and
per-response-token log probabilities. Sequence ``s`` is ``prompt + response[:-1]``; response token ``i`` is predicted
at position ``P + i − 1`` (not scored with an empty prompt's first token); only those positions get logits.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

__all__ = ["LAYOUTS", "PackedBatch", "gather_logprobs", "pack_sequences", "selected_logits"]

LAYOUTS: tuple[str, ...] = ("padded", "packed")


@dataclass
class PackedBatch:
    """Model inputs for N (prompt, response) sequences ([R, T] ``input_ids``, ``position_ids``, ``attention_mask``:
    ``None`` when packed) and the K positions whose logits score a response token: ``keep_mask`` [R, T]; ``targets``,
    ``seq_index``, ``token_index`` [K] (row-major); ``scored`` [N, L_max] (L_max ≥ 1). ``tokens``: prompt + response
    tokens (the learner's "tokens processed")."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    keep_mask: torch.Tensor
    targets: torch.Tensor
    seq_index: torch.Tensor
    token_index: torch.Tensor
    scored: torch.Tensor
    n_sequences: int
    max_response_len: int
    tokens: int
    layout: str

    def to(self, device: str | torch.device) -> PackedBatch:
        tensors = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(self, **{k: v.to(device) for k, v in tensors.items() if isinstance(v, torch.Tensor)})

    @property
    def input_tokens(self) -> int:
        """Slots in the model input (real + padding)."""
        return int(self.input_ids.numel())


def _first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        for b, room in enumerate(free):
            if n <= room:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins


def pack_sequences(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    layout: str = "packed",
    pad_id: int = 0,
    capacity: int | None = None,
) -> PackedBatch:
    """Lay out N pairs as model inputs: one right-padded row per sequence (``"padded"``) or sequences packed
    first-fit-decreasing into rows of ``capacity`` tokens (default: the longest sequence) with ``position_ids``
    restarting per sequence and no attention mask (``"packed"``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"pack_sequences: layout must be one of {LAYOUTS}, got {layout!r}")
    if len(prompts) != len(responses):
        raise ValueError(f"pack_sequences: {len(prompts)} prompts but {len(responses)} responses")
    n = len(prompts)
    p_arr = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prompts]
    r_arr = [np.asarray(r, dtype=np.int64).reshape(-1) for r in responses]
    seqs = [np.concatenate([p, r[:-1]]) if len(r) else p for p, r in zip(p_arr, r_arr, strict=True)]
    lengths = [len(s) for s in seqs]
    max_l = max([len(r) for r in r_arr] + [1])
    tokens = int(sum(len(p) + len(r) for p, r in zip(p_arr, r_arr, strict=True)))
    scored = np.zeros((n, max_l), dtype=bool)

    laid = [i for i in range(n) if lengths[i] > 0]
    width = max([lengths[i] for i in laid] + [1])
    if layout == "padded":
        rows = [[i] for i in laid]
    else:
        if capacity is not None:
            if capacity < width:
                raise ValueError(f"pack_sequences: capacity {capacity} < longest sequence {width}")
            width = capacity
        rows = _first_fit_decreasing([lengths[i] for i in laid], width)
        rows = [[laid[j] for j in row] for row in rows]
        if rows:
            width = max(sum(lengths[i] for i in row) for row in rows)
    n_rows = max(len(rows), 1)
    input_ids = np.full((n_rows, width), pad_id, dtype=np.int64)
    position_ids = np.zeros((n_rows, width), dtype=np.int64)
    attention = np.zeros((n_rows, width), dtype=np.int64)
    seq_grid = np.full((n_rows, width), -1, dtype=np.int64)
    tok_grid = np.full((n_rows, width), -1, dtype=np.int64)
    tgt_grid = np.zeros((n_rows, width), dtype=np.int64)
    for r, row in enumerate(rows):
        off = 0
        for i in row:
            s, plen, resp = seqs[i], len(p_arr[i]), r_arr[i]
            ln = len(s)
            input_ids[r, off:off + ln] = s
            position_ids[r, off:off + ln] = np.arange(ln)
            attention[r, off:off + ln] = 1
            # response token j is predicted at sequence position plen + j - 1 (if that is >= 0)
            j = np.arange(len(resp))
            pos = plen + j - 1
            ok = pos >= 0
            seq_grid[r, off + pos[ok]] = i
            tok_grid[r, off + pos[ok]] = j[ok]
            tgt_grid[r, off + pos[ok]] = resp[ok]
            scored[i, j[ok]] = True
            off += ln
    keep = tok_grid >= 0
    return PackedBatch(
        input_ids=torch.from_numpy(input_ids),
        position_ids=torch.from_numpy(position_ids),
        attention_mask=torch.from_numpy(attention) if layout == "padded" else None,
        keep_mask=torch.from_numpy(keep),
        targets=torch.from_numpy(tgt_grid[keep]),
        seq_index=torch.from_numpy(seq_grid[keep]),
        token_index=torch.from_numpy(tok_grid[keep]),
        scored=torch.from_numpy(scored),
        n_sequences=n,
        max_response_len=max_l,
        tokens=tokens,
        layout=layout,
    )


_LOGITS_TO_KEEP_OK: dict[type, bool] = {}


def selected_logits(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The logits of ``model`` on ``batch`` at ``keep_mask`` positions, [K, V], through ``logits_to_keep=<bool mask>``
    where the model accepts it (else all logits, indexed); no cache (it would disable the packed block mask)."""
    if batch.keep_mask.sum() == 0:
        vocab = model.get_output_embeddings().weight.shape[0]
        return torch.zeros((0, vocab), device=batch.input_ids.device)
    kwargs = dict(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False)
    if batch.attention_mask is not None:
        kwargs["attention_mask"] = batch.attention_mask
    cls = type(model)
    if cls not in _LOGITS_TO_KEEP_OK:
        _LOGITS_TO_KEEP_OK[cls] = "logits_to_keep" in inspect.signature(model.forward).parameters
    if _LOGITS_TO_KEEP_OK[cls]:
        try:
            logits = model(**kwargs, logits_to_keep=batch.keep_mask).logits
        except IndexError:  # transformers < 5.20 (vLLM's pin) indexes [:, mask, :] with the 2-D mask
            logits = None
        if logits is not None and logits.dim() == 2 and logits.shape[0] == int(batch.keep_mask.sum()):
            return logits
        _LOGITS_TO_KEEP_OK[cls] = False  # older transformers: the bool mask was not understood
    logits = model(**kwargs).logits
    return logits[batch.keep_mask]


def gather_logprobs(logits_KV: torch.Tensor, ids_K: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[ids], computed in float32: [K, V] with [K] → [K], or with [K, k] → [K, k]."""
    logits = logits_KV.float()
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    if ids_K.dim() == 1:
        return (logits.gather(-1, ids_K.unsqueeze(-1)) - lse).squeeze(-1)
    return logits.gather(-1, ids_K) - lse


def scatter_rows(values_K: torch.Tensor, batch: PackedBatch, fill: float = 0.0) -> torch.Tensor:
    """Put per-kept-position values ([K] or [K, k]) into [N, L_max] (or [N, L_max, k]) at their response positions."""
    shape = (batch.n_sequences, batch.max_response_len) + tuple(values_K.shape[1:])
    out = torch.full(shape, fill, dtype=values_K.dtype, device=values_K.device)
    return out.index_put((batch.seq_index, batch.token_index), values_K)
