"""Two-node simulation (`ray.cluster_utils.Cluster`, not AutoscalingCluster) of training and ANCE: two Ray
Train workers that cannot share a node (0.6 CPU each on two 1-CPU nodes), one per node, train a tiny
DPR for a few steps; then ANCE's trainer and index refresher (0.6 CPU each) run on different nodes.
Checkpoints, the final model and the negatives versions land where `train.storage_path` says.
(Encoding on two nodes: tests/integration/test_encode_cluster.py.)

The cluster runs in a subprocess of its own session (never the session Ray fixture; a process
is connected to one Ray at a time), ended by killing that session's processes.

Nothing here assumes a fast machine (it must hold at load 35 on 2 cores): the nodes are waited for
as long as the run makes progress (not Ray's 30 s `Cluster` windows), Ray's start-up windows are
widened (subprocs.RAY_START_WINDOWS), the state API gets 10 min, and ANCE's trainer waits at step 8
until the refresher has published its first version, so the switch to it happens within the run
whatever the load (no race between 24 steps and a refresh). The run is stuck only when it shows no
progress (an output line, a new file under the test's folder) for 10 min.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from subprocs import IDLE_LIMIT_S, RAY_START_WINDOWS, free_port, run_cluster_script

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback only (pipeline.ray_runtime does the same)
    os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.1"
    from pipeline.runtime_env import setup_offline_env
    setup_offline_env()
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from pipeline.data.ingest import ingest
    from pipeline.recipes.ance import run_ance
    from pipeline.data.bundled import python_faq_dir
    from pipeline.train.config import load_train_config
    from pipeline.train.trainer import train

    tmp, model, dash, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    ingest([python_faq_dir()], "beir", tmp / "corpus", progress=False)
    print("STAGE corpus ingested", flush=True)
    # the nodes are waited for (as long as `limit`), not for Cluster's fixed 30 s (add_node's wait)
    cluster = Cluster(initialize_head=False)
    cluster.add_node(wait=False, num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1",
                     dashboard_port=dash, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    cluster.add_node(wait=False, num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    cluster.wait_for_nodes(timeout=limit)
    print("STAGE two nodes up", flush=True)
    ray.init(address=cluster.address, log_to_driver=False)
    versions = tmp / "storage" / "two_node_ance" / "negatives"

    def first_version_published(model):
        """ANCE's trainer (its validation hook, at step 8: checkpoint 4 is on disk) waits until the
        refresher has published a version, so the trainer switches to one within the run however slow
        the refresh is under load; after `limit` s without one the run fails naming it."""
        import time

        from pipeline.data.negatives import list_versions

        t0 = time.monotonic()
        while not list_versions(versions):
            if time.monotonic() - t0 > limit:
                raise RuntimeError(f"no negatives version in {versions} within {limit:g} s of the first checkpoint")
            time.sleep(0.2)
        return {}

    try:
        job = load_train_config(None, [
            f"model.name_or_path={model}", "model.pooling=mean", "model.normalize=true", "model.query_max_length=32",
            "model.doc_max_length=64", f"data.corpus={tmp / 'corpus'}", "loss.name=dpr", "train.num_workers=2",
            "train.cpus_per_worker=0.6", "train.batch_size=8", "train.max_steps=4", "train.checkpoint_every=2",
            "train.report_every=2", f"train.storage_path={tmp / 'storage'}", "train.name=two_node", "optim.lr=1e-4"])
        summary = train(job, progress=False)
        print("STAGE trained on two nodes", flush=True)
        # the state API's answer waited for as long as `limit` (its default: 30 s)
        # (this cluster's address: with none the state API looks for every Ray on the machine)
        listed = list_actors(address=cluster.address, detail=True, limit=1000, timeout=int(limit))
        workers = [a for a in listed if "TrainWorker" in a.class_name]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        # ANCE: one training worker and the index refresher, 0.6 CPU each: one per node
        ance = load_train_config(None, [
            f"model.name_or_path={model}", "model.pooling=mean", "model.normalize=true", "model.query_max_length=32",
            "model.doc_max_length=64", f"data.corpus={tmp / 'corpus'}", "data.hard_negatives=1", "loss.name=ance",
            "train.num_workers=1", "train.cpus_per_worker=0.6", "train.batch_size=8", "train.max_steps=24",
            "train.eval_every=8", "train.report_every=4", "train.negatives_poll_every=2",
            f"train.storage_path={tmp / 'storage'}",
            "train.name=two_node_ance", "optim.lr=1e-4", "ance.refresh_every=4", "ance.top_k=30", "ance.negatives=5",
            "ance.cpus=0.6", "ance.poll_seconds=0.2", "ance.precision=fp32", "ance.max_missed_refreshes=0",
            f"ance.heartbeat_timeout_s={limit:g}",  # a starved heartbeat thread is not a lost refresher
            f"ance.dev_queries={tmp / 'corpus' / 'queries.tsv'}",
            f"ance.dev_qrels={tmp / 'corpus' / 'qrels' / 'test.trec'}", "ance.keep_versions=2"])
        ance_summary = run_ance(ance, validate_fn=first_version_published, progress=False)
        print("STAGE ANCE trained", flush=True)
        actors = list_actors(address=cluster.address, detail=True, limit=1000, timeout=int(limit))
        refreshers = [a for a in actors if "IndexRefresher" in a.class_name]
        ance_workers = [a for a in actors if "TrainWorker" in a.class_name and a.actor_id not in
                        {w.actor_id for w in workers}]
        print("RESULT " + json.dumps({"steps": summary["steps"], "cluster_nodes": alive,
                                      "worker_nodes": sorted({a.node_id for a in workers}),
                                      "workers": len(workers), "ance_steps": ance_summary["steps"],
                                      "ance_versions": [v["version"] for v in ance_summary["negatives_versions"]],
                                      "refresher_nodes": sorted({a.node_id for a in refreshers}),
                                      "ance_worker_nodes": sorted({a.node_id for a in ance_workers})}))
    finally:
        ray.shutdown()
        cluster.shutdown()
''')


def test_training_spreads_over_two_nodes(tiny_model_dir, tmp_path):
    # stuck only after IDLE_LIMIT_S without a new output line or file under tmp_path (checkpoints, versions)
    res, folder = run_cluster_script(SCRIPT, tmp_path, lambda d: (d, tiny_model_dir, free_port(), IDLE_LIMIT_S),
                                     timeout=6 * IDLE_LIMIT_S, idle=IDLE_LIMIT_S, env=RAY_START_WINDOWS,
                                     what="two-node training")
    assert res["steps"] == 4
    assert len(res["cluster_nodes"]) == 2
    assert res["worker_nodes"] == res["cluster_nodes"]  # one training worker on each simulated node
    run = folder / "storage" / "two_node"
    assert (run / "model" / "modules.json").exists()  # the final model where train.storage_path says
    assert "step-00000004" in {p.name for p in run.glob("step-*")}  # the last checkpoint, in the storage path
    assert json.loads((run / "summary.json").read_text())["steps"] == 4
    # ANCE: the trainer and the refresher on different nodes; versions published in the storage path
    assert res["ance_steps"] == 24 and res["ance_versions"]  # the trainer switched to a published version
    assert len(res["refresher_nodes"]) == 1 and len(res["ance_worker_nodes"]) == 1
    assert res["refresher_nodes"] != res["ance_worker_nodes"]
    assert sorted(set(res["refresher_nodes"] + res["ance_worker_nodes"])) == res["cluster_nodes"]
    assert list((folder / "storage" / "two_node_ance" / "negatives").glob("v-*"))
