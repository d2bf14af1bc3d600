"""Two-node simulation (`ray.cluster_utils.Cluster`): at most one encoder actor per node (forced by
resources), each shard written by an encoder actor on its own node; every passage is encoded exactly once
and no vector passes through the driver.

The cluster runs in a subprocess so it never meets the session-scoped local Ray of the
other integration tests (a process can be connected to one Ray at a time).

Nothing here assumes a fast machine (as in test_two_node.py): the nodes are waited for as long as the
run makes progress (not Ray's 30 s `Cluster` windows), Ray's start-up windows are widened
(subprocs.RAY_START_WINDOWS), the state API gets 10 min, and the run is stuck only when it shows no
progress (an output line, a new or changed file under the test's folder) for 10 min.
"""

from __future__ import annotations

import textwrap

import pytest
from subprocs import IDLE_LIMIT_S, RAY_START_WINDOWS, free_port, run_cluster_script

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent('''
    import json, os, random, sys
    from pathlib import Path

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray 2.60 re-resolves 127.0.0.1 to the routable IP unless its cluster mode is off
    # (as pipeline.ray_runtime does for a local Ray): then every node and the driver use loopback
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from pipeline.runtime_env import setup_offline_env
    setup_offline_env()
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.config import load_config
    from pipeline.data.ingest import ingest
    from pipeline.index import encode as encode_mod
    from pipeline.index.shards import iter_shards

    tmp, model, dash, limit = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    rng = random.Random(0)
    (tmp / "c.tsv").write_text("".join(f"{i}\\t{' '.join(rng.choice('ab cd ef gh'.split()) for _ in range(rng.randint(3, 40)))}\\n"
                                      for i in range(120)))
    ingest([tmp / "c.tsv"], "msmarco", tmp / "corpus", part_rows=30, progress=False)
    print("STAGE corpus ingested", flush=True)

    # the nodes are waited for (as long as `limit`), not for Cluster's fixed 30 s (add_node's wait)
    cluster = Cluster(initialize_head=False)
    # the first node added is the head; its dashboard answers list_actors
    cluster.add_node(wait=False, num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1",
                     dashboard_port=dash, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    cluster.add_node(wait=False, num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    cluster.wait_for_nodes(timeout=limit)
    print("STAGE two nodes up", flush=True)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        received = []
        real_collect = encode_mod._collect

        def spy_collect(ds, todo_rows, show_progress, *rest):
            original = ds.iter_batches

            def iter_batches(*a, **k):
                for batch in original(*a, **k):
                    received.append({c: [v.dtype.kind, int(v.nbytes), list(v.shape)] for c, v in batch.items()})
                    yield batch

            ds.iter_batches = iter_batches
            return real_collect(ds, todo_rows, show_progress, *rest)

        encode_mod._collect = spy_collect
        cfg = load_config(None, [f"model.name_or_path={model}", "model.pooling=mean", "encode.num_actors=2",
                                 "encode.cpus_per_actor=1", "encode.shard_rows=15", "encode.batch_size=8",
                                 "encode.show_progress=false"])
        summary = encode_mod.encode_corpus(tmp / "corpus", tmp / "emb", cfg)
        markers = [json.loads(p.read_text()) for p in sorted((tmp / "emb").glob("shard-*.done"))]
        pids = [p for ids, _ in iter_shards(tmp / "emb") for p in ids]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        from ray.util.state import list_actors
        # the state API's answer waited for as long as `limit` (its default: 30 s)
        # (this cluster's address: with none the state API looks for every Ray on the machine, and more than one
        # runs when tests run side by side)
        listed = list_actors(address=cluster.address, detail=True, limit=1000, timeout=int(limit))
        actors = {a.pid: [a.node_id, a.state] for a in listed
                  if "MapWorker" in a.class_name and a.pid}
        print("RESULT " + json.dumps({"summary": summary, "writers": [[m["node"], m["pid"]] for m in markers],
                                      "cluster_nodes": alive, "encoder_actors": actors, "pids": pids,
                                      "received": received}))
    finally:
        ray.shutdown()
        cluster.shutdown()
''')


def test_two_nodes_write_their_own_shards_every_pid_once(tiny_model_dir, tmp_path):
    # stuck only after IDLE_LIMIT_S without a new output line or a file change under tmp_path (shards)
    res, _ = run_cluster_script(SCRIPT, tmp_path, lambda d: (d, tiny_model_dir, free_port(), IDLE_LIMIT_S),
                                timeout=6 * IDLE_LIMIT_S, idle=IDLE_LIMIT_S, env=RAY_START_WINDOWS,
                                what="two-node encode")
    assert res["summary"]["actors"] == 2 and res["summary"]["shards"] == 8
    assert len(res["cluster_nodes"]) == 2
    # Placement is forced (1-CPU nodes, 1-CPU actors: at most one encoder actor per node). Which actor
    # takes how many shards is the scheduler's business (one may take all eight under load); what is
    # guaranteed is that each shard was written by an encoder actor on the node that actor ran on.
    listed = res["encoder_actors"]
    actors = {int(pid): node for pid, (node, _state) in listed.items() if node}  # the ones that were placed
    assert set(actors.values()) <= set(res["cluster_nodes"]), listed
    assert len(res["writers"]) == 8
    for node, pid in res["writers"]:
        assert actors.get(pid) == node, f"shard written on {node} by pid {pid}, not an encoder actor there: {listed}"
    for node in res["cluster_nodes"]:  # one actor per node: a node's shards all come from one process
        assert len({pid for n, pid in res["writers"] if n == node}) <= 1, res["writers"]
    assert sorted(res["pids"], key=int) == [str(i) for i in range(120)] and len(set(res["pids"])) == 120
    # the driver received one small receipt per shard: a name, a row count, seconds; no vectors
    assert sum(len(b["rows"][2]) and b["rows"][2][0] for b in res["received"]) == 8
    for batch in res["received"]:
        assert set(batch) == {"name", "rows", "seconds"}
        assert all(len(shape) == 1 for _, _, shape in batch.values())
        assert sum(nbytes for _, nbytes, _ in batch.values()) < 1024
