"""Draw the home page's figure: one vanilla batch beside one DivOPD batch, composed by ``divopd.sampling`` from the
same experience log.

    python docs/batch_figure.py [OUT_PNG]      # default: docs/images/batches.png

The PNG is committed; ``tests/test_docs_commands.py`` checks that the numbers ``docs/index.md`` quotes are the ones
this script composes.

The log is written by ``divopd simulate`` (the ``alfworld`` preset: a 50-step limit, long failed rollouts whose turns
arrive together when the rollout ends; 8 explorers, B = 64, 16 updates, seed 0). Both samplers receive the same
arrivals, update by update; the figure shows the batch each composes for update 12: one cell per selected turn,
coloured by rollout, with the batch's effective rollouts (1 / Σ p_r², token shares) and largest rollout share, the
numbers ``divopd.sampling.stats.batch_stats`` logs as ``sampler/effective_rollouts`` and ``sampler/max_rollout_share``.
Seeded and deterministic.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from divopd.analysis.simulate import simulate  # noqa: E402
from divopd.experience.log.reader import read_log  # noqa: E402
from divopd.sampling import Batch, SamplerConfig, make_sampler  # noqa: E402

HERE = Path(__file__).resolve().parent
BATCH, UPDATES, SHOWN = 64, 16, 12


def compose(log: Path) -> dict[str, Batch]:
    """The batch that ``vanilla`` and ``divopd`` (k = 4, pool 4B, staleness 2) compose for update ``SHOWN``."""
    by_update: dict[int, list] = {}
    for logged in read_log(log):
        by_update.setdefault(logged.arrival_update, []).append(logged.turn)
    out: dict[str, Batch] = {}
    for method in ("vanilla", "divopd"):
        sampler = make_sampler(SamplerConfig(method, batch_size=BATCH, pool_factor=4, cap=4, max_staleness=2))
        version = 0
        for update in range(UPDATES):
            sampler.add(by_update.get(update, []))
            batch = sampler.next_batch(version)
            if batch is None:
                continue
            version += 1
            if version == SHOWN:
                out[method] = batch
                break
    return out


def draw(batches: dict[str, Batch], out: Path) -> None:
    cols = 16
    fig, axes = plt.subplots(1, 2, figsize=(11, 2.7))
    cmap = plt.get_cmap("tab20")
    for ax, (label, method) in zip(axes, (("vanilla (arrival order)", "vanilla"),
                                           ("DivOPD (rollout-first, cap k = 4, focus)", "divopd")), strict=True):
        batch = batches[method]
        colors: dict[str, int] = {}
        for i, turn in enumerate(batch.payloads):
            c = colors.setdefault(turn.rollout_id, len(colors))
            ax.add_patch(plt.Rectangle((i % cols, -(i // cols)), 0.92, 0.92, color=cmap(c % 20)))
        ax.set_xlim(-0.2, cols)
        ax.set_ylim(-(BATCH // cols) + 0.8, 1.1)
        ax.set_aspect("equal")
        ax.axis("off")
        stats = batch.stats
        ax.set_title(f"{label}\n{stats['distinct_rollouts']} rollouts, effective rollouts "
                     f"{stats['effective_rollouts']:.1f}, max share {stats['max_rollout_share']:.0%}", fontsize=10)
    fig.suptitle(f"One batch of B = {BATCH} turns (one cell per turn, one colour per rollout), same arrivals",
                 fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(out: str | Path = HERE / "images" / "batches.png") -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        simulate("alfworld", log, explorers=8, updates=UPDATES, seed=0, batch_size=BATCH)
        batches = compose(log)
    draw(batches, Path(out))
    return Path(out)


if __name__ == "__main__":
    print(main(*sys.argv[1:2]))
