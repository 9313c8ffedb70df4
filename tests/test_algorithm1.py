"""Algorithm 1 of the paper, re-stated literally, against the sampler.

``algorithm1`` below is the appendix's nine steps written out plainly, one update at a time. Random streams (rollouts
of varying length arriving at varying updates, stale turns, invalid turns, a tight c·B read, a small W) go through
the real sampler (``divopd`` and ``divopd-base``) and through it; every update must select the same number of turns
from every rollout (for ``divopd``: the same turns, in the same order) and expire / reject the same counts.
"""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np
import pytest

from divopd import Turn, gate
from divopd.sampling import SamplerConfig, make_sampler
from divopd.sampling.rules import pool_capacity
from sampler_helpers import focus_key

B, C, K, DELTA, W = 6, 2, 2, 6, 2


def make_stream(seed: int, updates: int = 24) -> list[list[Turn]]:
    """Per update q, the turns arriving before update q (a rollout's turns arrive together, when it ends)."""
    rng = np.random.default_rng(seed)
    stream: list[list[Turn]] = [[] for _ in range(updates)]
    n = 0
    for q in range(updates):
        for _ in range(int(rng.integers(0, 5))):
            version = max(0, q - int(rng.integers(0, 9)))  # some arrive stale
            rid = f"r{int(rng.integers(0, 10**6)):06d}-{n}"  # ids in no particular order: ties are broken by id
            for t in range(int(rng.integers(1, 7))):
                length = int(rng.integers(1, 4))
                teacher = (-rng.random(length) * 3).tolist()
                if rng.random() < 0.15:
                    teacher = [math.nan] * length  # no scored token: the gate rejects it
                stream[q].append(Turn(rollout_id=rid, turn_index=t, policy_version=version,
                                      prompt_ids=[1, 2], response_ids=[5] * length,
                                      student_logprobs=(-rng.random(length)).tolist(), teacher_logprobs=teacher))
            n += 1
    return stream


def algorithm1(stream: list[list[Turn]], within: str, seed: int = 0) -> list[dict]:
    """The appendix's Algorithm 1, step by step. Returns per update: selected keys in order, counts."""
    pending: list[tuple[Turn, int]] = []  # P: (turn, first-seen update)
    queue: deque[Turn] = deque()  # E
    compositions = 0
    out = []
    for q, arrivals in enumerate(stream):
        queue.extend(arrivals)
        expired = Counter()
        # 1. v_min = max(q − δ, 0); drop pending turns below it. (The queue's stale turns are skipped when read in
        #    step 2; dropping them all now, as the sampler does, gives the same batches and the same totals.)
        v_min = max(q - DELTA, 0)
        expired["stale"] += sum(u.policy_version < v_min for u, _ in pending)
        pending = [(u, s) for u, s in pending if u.policy_version >= v_min]
        expired["stale"] += sum(u.policy_version < v_min for u in queue)
        queue = deque(u for u in queue if u.policy_version >= v_min)
        # 2. read fresh turns until |P| + |F| = c·B or the queue is empty; invalid turns use up part of the read
        fresh = []
        while len(pending) + len(fresh) < pool_capacity(B, C) and queue:
            fresh.append(queue.popleft())
        # 3. V = the valid candidates; the rest is discarded; fresh turns are stamped first-seen q
        invalid = sum(gate.check(u) is not None for u in fresh)
        candidates = pending + [(u, q) for u in fresh if gate.check(u) is None]
        if len(candidates) < B:  # no update can be composed: everything waits
            pending = candidates
            out.append({"keys": None, "expired": expired, "invalid": invalid})
            continue
        # 4. group by rollout id; groups by their oldest first-seen update, ties by rollout id
        groups: dict[str, list[tuple[Turn, int]]] = {}
        for u, s in candidates:
            groups.setdefault(u.rollout_id, []).append((u, s))
        order = sorted(groups, key=lambda rid: (min(s for _, s in groups[rid]), rid))
        # 5. inside each group: descending s(u), ties by (rid, t) — or, for DivOPD-base, a uniform random order
        #    (the sampler's draw: one key per candidate, candidates listed group by group, by arrival inside)
        if within == "focus":
            ranked = {rid: sorted(groups[rid], key=lambda e: focus_key(e[0])) for rid in order}
        else:
            rng = np.random.default_rng([seed, compositions])
            listed = [e for rid in order for e in sorted(groups[rid], key=lambda e: arrival[id(e[0])])]
            keys = dict(zip((id(u) for u, _ in listed), rng.random(len(listed)).tolist(), strict=True))
            ranked = {rid: sorted(groups[rid], key=lambda e: keys[id(e[0])]) for rid in order}
        compositions += 1
        # 6-7. sweep the ordered groups with cap h = k, then h + 1, ... until |S| = B
        selected: list[Turn] = []
        taken = dict.fromkeys(order, 0)
        h = K
        while len(selected) < B:
            for rid in order:
                while taken[rid] < min(h, len(ranked[rid])) and len(selected) < B:
                    selected.append(ranked[rid][taken[rid]][0])
                    taken[rid] += 1
            h += 1
        # 8. pending for the next update: unselected valid turns first seen at most W updates ago
        chosen = {id(u) for u in selected}
        rest = [(u, s) for u, s in candidates if id(u) not in chosen]
        expired["pending_age"] += sum(q - s > W for _, s in rest)
        pending = [(u, s) for u, s in rest if q - s <= W]
        # 9. S goes to the learner
        out.append({"keys": [u.key for u in selected], "expired": expired, "invalid": invalid})
    return out


arrival: dict[int, int] = {}


@pytest.mark.parametrize("method,within", [("divopd", "focus"), ("divopd-base", "uniform")])
@pytest.mark.parametrize("seed", range(12))
def test_the_sampler_is_algorithm_1(method: str, within: str, seed: int) -> None:
    stream = make_stream(seed)
    arrival.clear()
    arrival.update({id(u): i for i, u in enumerate(u for arrivals in stream for u in arrivals)})
    expected = algorithm1(stream, within)
    sampler = make_sampler(SamplerConfig(method, batch_size=B, pool_factor=C, cap=K, max_staleness=DELTA,
                                         max_pending_age=W))
    composed = 0
    for q, arrivals in enumerate(stream):
        before = sampler.ledger
        sampler.add(arrivals)
        batch = sampler.next_batch(q)
        after = sampler.ledger
        want = expected[q]
        if want["keys"] is None:
            assert batch is None, q
        else:
            composed += 1
            got = [t.key for t in batch.payloads]
            assert Counter(k[0] for k in got) == Counter(k[0] for k in want["keys"]), (q, got, want["keys"])
            if within == "focus":
                assert got == want["keys"], q
        for reason in ("stale", "pending_age"):
            assert after.expired_by_reason[reason] - before.expired_by_reason[reason] == \
                want["expired"][reason], (q, reason)
        assert after.invalid - before.invalid == want["invalid"], q
    assert composed >= 4  # the stream exercises real compositions


def test_streams_exercise_every_rule() -> None:
    """Over the seeds, the literal algorithm meets stale turns, invalid turns in the read and W expiries."""
    totals: Counter = Counter()
    for seed in range(12):
        for r in algorithm1(make_stream(seed), "focus"):
            totals.update(r["expired"])
            totals["invalid"] += r["invalid"]
    assert totals["stale"] > 0 and totals["pending_age"] > 0 and totals["invalid"] > 0


def test_invalid_turns_use_up_the_read() -> None:
    """c·B = 4 and the queue holds 2 invalid then 4 valid turns: only 2 valid turns enter the pool (B = 2)."""
    bad = [Turn(rollout_id="bad", turn_index=i, policy_version=0, prompt_ids=[1], response_ids=[2],
                student_logprobs=[-1.0], teacher_logprobs=[math.nan]) for i in range(2)]
    good = [Turn(rollout_id=f"g{i}", turn_index=0, policy_version=0, prompt_ids=[1], response_ids=[2],
                 student_logprobs=[-1.0], teacher_logprobs=[-0.5]) for i in range(4)]
    sampler = make_sampler(SamplerConfig("divopd", batch_size=2, pool_factor=2, cap=1))
    sampler.add(bad + good)
    batch = sampler.next_batch(0)
    assert [t.rollout_id for t in batch.payloads] == ["g0", "g1"]
    assert sampler.ledger.invalid == 2 and sampler.ledger.pending == 0 and sampler.ledger.queued == 2


def test_groups_are_visited_by_first_seen_update_then_rollout_id() -> None:
    """'z' was first seen at update 0 and waits; 'a' and 'b' arrive later: z first, then a before b (rollout id)."""
    def turn(rid: str, t: int, score: float) -> Turn:
        return Turn(rollout_id=rid, turn_index=t, policy_version=0, prompt_ids=[1], response_ids=[2],
                    student_logprobs=[0.0], teacher_logprobs=[-score])

    sampler = make_sampler(SamplerConfig("divopd", batch_size=1, pool_factor=3, cap=1, max_staleness=10))
    sampler.add([turn("z", 0, 1.0), turn("z", 1, 0.5)])
    assert sampler.next_batch(0).payloads[0].key == ("z", 0)
    sampler.add([turn("b", 0, 9.0), turn("a", 0, 9.0)])
    assert sampler.next_batch(1).payloads[0].key == ("z", 1)  # z's group is the oldest
    assert sampler.next_batch(2).payloads[0].rollout_id == "a"  # same first-seen update: by rollout id, not arrival


def test_first_seen_stamps_and_ages_survive_state_dict() -> None:
    stream = make_stream(5)
    cfg = SamplerConfig("divopd", batch_size=B, pool_factor=C, cap=K, max_staleness=DELTA, max_pending_age=W)
    a, b = make_sampler(cfg), make_sampler(cfg)
    for q, arrivals in enumerate(stream):
        a.add(arrivals)
        b.add(arrivals)
        ba, bb = a.next_batch(q), b.next_batch(q)
        assert (ba is None) == (bb is None)
        if ba is not None:
            assert [t.key for t in ba.payloads] == [t.key for t in bb.payloads]
        if q == 10:  # b restarts from a state_dict through JSON
            import json

            b = make_sampler(cfg)
            b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert a.ledger == b.ledger
