"""Masked response tokens of a cross-tokenizer teacher, per tokenizer family, in real ``divopd train`` runs.

A tiny student and tiny teachers (random-init 0.2M-parameter Llamas) whose tokenizers are of the families real models
use (``divopd.models.tiny.build_tokenizer`` kinds: a Llama-2-style SentencePiece BPE with a dummy prefix, a
Metaspace Unigram, a word-level vocabulary whose decoder joins words with spaces, a byte-level BPE), trained on the
``tiny`` environment's text. For each pairing a short ``divopd train tiny`` (lockstep, a few updates) runs in a child
process; the table gives the scored turns' response tokens, how many the teacher could not score (NaN: masked), and
the run's ``explorer/teacher_masked_tokens``, and why each masked token is masked, by this checkout's mapping: in the
chunk of a teacher ``<unk>`` (text the teacher cannot spell), whitespace the teacher has no token for (after a
segment's last teacher token), or other (neither: what the mapping, not the text, masks). The responses are the
environment's actions after ``<|assistant|>``: they start without a space, the case a dummy prefix used to mask.

    python benchmarks/teacher_families.py                    # this checkout's divopd
    python benchmarks/teacher_families.py --src OTHER/src    # another divopd (e.g. an older checkout) runs the trains

The models are built by this checkout's divopd in any case; ``--src`` only chooses the divopd of the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: (student kind, teacher kind): every family as teacher of the tiny models' student, the dummy-prefix family as
#: student of a byte-level teacher, and a byte-level BPE teacher with fewer merges (a same-id subset of the student's)
PAIRS = [("word", "sentencepiece"), ("word", "metaspace"), ("word", "whitespace"), ("word", "bpe"),
         ("sentencepiece", "bpe"), ("bpe", "bpe-subset")]


def build(out: Path, kind: str, seed: int) -> str:
    """A 0.2M Llama with a ``kind`` tokenizer trained on the tiny env's text, saved at ``out/kind`` (``bpe-subset``: a
    byte-level BPE with fewer merges than ``bpe``'s, the same ids for the tokens it has)."""
    from divopd.explore.envs.tiny import tiny_corpus
    from divopd.models.tiny import build_model, build_tokenizer

    folder = out / kind
    if not (folder / "config.json").is_file():
        size = {"word": 4096, "bpe-subset": 280}.get(kind, 600)
        tok = build_tokenizer(tiny_corpus(), kind=kind.removesuffix("-subset"), vocab_size=size)
        build_model(tok, size="0.2m", seed=seed).save_pretrained(folder)
        tok.save_pretrained(folder)
    return str(folder)


def causes(student: Any, teacher: Any, prompt: list[int], response: list[int], masked: np.ndarray) -> Counter:
    """Why each masked position of one turn is masked (this checkout's plan of the turn): ``unk`` (its chunk holds a
    teacher ``<unk>``), ``whitespace`` (whitespace-only text after the segment's last teacher token) or ``other``."""
    from divopd.explore.vocab_align import Translator, plan_turn

    out: Counter = Counter()
    at = 0
    for seg in plan_turn(Translator(student, teacher), prompt, response).segments:
        for j, chunk in enumerate(seg.student_chunk):
            if masked[at + j]:
                text = student.decode([seg.student[j]], skip_special_tokens=False)
                out["unk" if chunk in seg.lost else "whitespace" if chunk == seg.n_chunks and not text.strip()
                    else "other"] += 1
        at += len(seg.student)
    return out


def run_pair(student: str, teacher: str, run_dir: Path, src: str, updates: int) -> dict[str, Any]:
    """One ``divopd train tiny`` with this pair; its masked counts."""
    from divopd.experience.log import read_log

    cmd = [sys.executable, "-m", "divopd", "train", "tiny", "--run-dir", str(run_dir), "--no-progress",
           "--set", f"student.path={student}", "--set", f"teacher.path={teacher}", "--set", f"updates={updates}",
           "--set", "runtime.kind=lockstep", "--set", "eval.every=1000", "--set", "eval.at_start=false"]
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"divopd train failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    from divopd.models import load_tokenizer

    s_tok, t_tok = load_tokenizer(student), load_tokenizer(teacher)
    tokens = masked = 0
    why: Counter = Counter()
    for lt in read_log(run_dir / "experience"):
        lp = lt.turn.teacher_logprobs
        if lp is not None:
            tokens += len(lp)
            bad = ~np.isfinite(np.asarray(lp, dtype=np.float64))
            masked += int(np.count_nonzero(bad))
            if bad.any():
                why += causes(s_tok, t_tok, lt.turn.prompt_ids.tolist(), lt.turn.response_ids.tolist(), bad)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    metric = [r.get("explorer/teacher_masked_tokens") for r in records if r.get("kind") == "update"]
    vocab = next((line for line in proc.stderr.splitlines() if "teacher vocabulary:" in line), "")
    return {"tokens": tokens, "masked": masked, **{k: why[k] for k in ("unk", "whitespace", "other")},
            "metric": metric[-1] if metric else float("nan"),
            "seconds": time.perf_counter() - t0, "vocab": vocab.split("teacher vocabulary:")[-1].strip()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(ROOT / "src"), help="the divopd the runs use (PYTHONPATH)")
    parser.add_argument("--out", default=None, help="where models and runs go (default: a temporary folder)")
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="divopd-families-"))
    rows = []
    for i, (s_kind, t_kind) in enumerate(PAIRS):
        student, teacher = build(out / "models", s_kind, 0), build(out / "models", t_kind, 1)
        res = run_pair(student, teacher, out / "runs" / f"{i}-{s_kind}-{t_kind}", args.src, args.updates)
        rows.append({"student": s_kind, "teacher": t_kind, **res})
    print(f"divopd of the runs: {args.src}; {args.updates} updates each, lockstep, tiny env")
    print("| student tokenizer | teacher tokenizer | path | response tokens | masked | masked % | in an <unk> chunk | "
          "whitespace without a teacher token | other | explorer/teacher_masked_tokens |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        share = 100.0 * r["masked"] / max(r["tokens"], 1)
        path = r["vocab"].split(" (")[0] or "?"
        print(f"| {r['student']} | {r['teacher']} | {path} | {r['tokens']} | {r['masked']} | {share:.1f} | "
              f"{r['unk']} | {r['whitespace']} | {r['other']} | {r['metric']} |")
    for r in rows:
        if r["vocab"]:
            print(f"{r['student']} student, {r['teacher']} teacher: teacher vocabulary: {r['vocab']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
