"""A multi-node Ray layout on one machine: ``ray.cluster_utils.Cluster`` with an explorer node and a
learner node (custom resources place the actors), learner ranks as Ray actors forming one gloo process group, and
a run that survives killing one explorer actor."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from test_train import read_metrics, tiny_config, tiny_models  # noqa: F401

ray = pytest.importorskip("ray")


class _KillExplorer:
    """Kills explorer 0's actor after update ``at``; two updates later asks the restarted actor its pid."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.pids: list[int] = []

    def on_update(self, trainer: object, metrics: dict) -> None:
        version = trainer.version  # type: ignore[attr-defined]
        if version not in (self.at, self.at + 2):
            return
        prefix = f"divopd-explorer-{os.getpid()}-"
        name = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                      if a["name"].startswith(prefix))[0]
        actor = ray.get_actor(name)
        deadline = time.monotonic() + 120
        while True:  # a restarting actor answers "temporarily unavailable" until its constructor has run again
            try:
                self.pids.append(ray.get(actor.pid.remote(), timeout=120))
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        if version == self.at:
            ray.kill(actor, no_restart=False)

    def on_eval(self, update: int, results: dict) -> None:
        pass


@pytest.mark.slow
def test_explorers_and_learner_ranks_on_their_nodes_and_a_killed_explorer(tiny_models: dict[str, str],  # noqa: F811
                                                                          tmp_path: Path) -> None:
    from ray.cluster_utils import Cluster

    from divopd.train.assemble import open_run, run_trainer

    os.environ["RAY_AUTH_MODE"] = "disabled"
    store = 128 * 2**20
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": store,
                                                            "include_dashboard": False})
    try:
        explorers = cluster.add_node(num_cpus=2, resources={"explorer_node": 4}, object_store_memory=store)
        learners = cluster.add_node(num_cpus=2, resources={"learner_node": 2}, object_store_memory=store)
        cluster.wait_for_nodes()
        cfg = tiny_config(tiny_models, tmp_path / "run", "divopd", updates=6,
                          **{"runtime.kind": "ray", "runtime.ray_address": cluster.address, "runtime.num_explorers": 2,
                             "runtime.explorer_cpus": 1, "runtime.explorer_resources": "{explorer_node: 1}",
                             "learner.world_size": 2, "runtime.learner_cpus": 1,
                             "runtime.learner_resources": "{learner_node: 1}", "eval.every": 100})
        trainer, _ = open_run(cfg)
        hook = _KillExplorer(at=2)
        summary = run_trainer(trainer, hook)
        # the run went on to the end; Ray restarted the killed explorer (a new process) while it did
        assert summary["updates"] == 6 and len(hook.pids) == 2 and hook.pids[0] != hook.pids[1]
        placement = summary["placement"]
        assert placement["learner_ranks"] == [learners.node_id] * 2
        assert placement["explorers"] == [explorers.node_id] * 2
        rows = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "update"]
        assert [r["update"] for r in rows] == [1, 2, 3, 4, 5, 6]
    finally:
        ray.shutdown()
        cluster.shutdown()
