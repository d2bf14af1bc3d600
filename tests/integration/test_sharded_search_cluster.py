"""Two-node simulation (`ray.cluster_utils.Cluster`) of a several-part index searched by search actors
(`retrieve.runner=ray`, index/search_actors.py): the parts are placed on both nodes by the memory each asks
for, every batch of queries is answered as the one-part index answers it, and an actor that dies is made again
and its part searched again (never a run without its passages). The cluster runs in a subprocess (see
test_encode_cluster.py for why, and for the waits that never assume a fast machine)."""

from __future__ import annotations

import textwrap

import pytest
from subprocs import IDLE_LIMIT_S, RAY_START_WINDOWS, free_port, run_cluster_script

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent('''
    import json, os, sys
    from pathlib import Path

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from pipeline.runtime_env import setup_offline_env
    setup_offline_env()
    import numpy as np
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.config import IndexConfig, load_config
    from pipeline.index.faiss_index import build_index, load_index
    from pipeline.index.search_actors import RaySearch
    from pipeline.index.shards import plan_part, write_shard

    tmp, dash, limit = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((800, 16)).astype(np.float32)
    emb = tmp / "emb"
    emb.mkdir()
    pids = [f"p{i}" for i in range(800)]
    specs = plan_part(0, "corpus/part-00000.parquet", pids, 100)
    for s in specs:
        write_shard(emb, s, pids[s["start"]:s["end"]], vectors[s["start"]:s["end"]])
    (emb / "embeddings.json").write_text(json.dumps({"complete": True, "shard_names": [s["name"] for s in specs],
        "rows": 800, "dim": 16, "corpus_fingerprint": "fp", "model_config": {}, "model": {"path": "/m"}}))
    build_index(emb, tmp / "one", IndexConfig(shards=1), progress=False)
    info = build_index(emb, tmp / "four", IndexConfig(shards=4), progress=False)
    biggest = max(p["bytes"] for p in info["parts"])
    print("STAGE indexes built", flush=True)

    cluster = Cluster(initialize_head=False)
    # each node's memory resource holds two parts, not three: the parts must spread over both
    node_memory = int(2.5 * biggest)
    cluster.add_node(wait=False, num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1",
                     dashboard_port=dash, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20,
                     memory=node_memory)
    cluster.add_node(wait=False, num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20,
                     memory=node_memory)
    cluster.wait_for_nodes(timeout=limit)
    print("STAGE two nodes up", flush=True)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        # the parts built again as Ray tasks on the cluster (index.build_runner=ray): the same index
        on_ray = build_index(emb, tmp / "four-ray", IndexConfig(shards=4, build_runner="ray"), progress=True)
        rebuilt_same = [p["rows"] for p in on_ray["parts"]] == [p["rows"] for p in info["parts"]]
        cfg = load_config(None, ["retrieve.runner=ray"])
        search = RaySearch(load_index(tmp / "four", resident=False), cfg, init=False)
        nodes = search.node_of()
        queries = rng.standard_normal((30, 16)).astype(np.float32)
        s1, i1 = load_index(tmp / "one").search(queries, 20)
        ray_built_same = bool(np.array_equal(load_index(tmp / "four-ray").search(queries, 20)[1], i1))
        first = search.search(queries, 20)
        second = search.search(queries[:10], 20)  # a second batch: nothing loaded again
        ray.kill(search.actors[2])
        after_kill = search.search(queries, 20)
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        too_big = None
        try:
            from pipeline.index.search_actors import place_parts
            place_parts(info["parts"], [{"memory": biggest * 0.5}])
        except Exception as e:
            too_big = str(e)
        print("RESULT " + json.dumps({
            "nodes": nodes, "cluster_nodes": alive,
            "same": bool(np.array_equal(first[1], i1)), "max_diff": float(np.abs(first[0] - s1).max()),
            "second_same": bool(np.array_equal(second[1], i1[:10])),
            "after_kill_same": bool(np.array_equal(after_kill[1], i1)), "too_big": too_big,
            "ray_built": rebuilt_same and ray_built_same}))
    finally:
        ray.shutdown()
        cluster.shutdown()
''')


def test_search_actors_on_two_nodes_answer_as_one_part_and_survive_a_dead_actor(tmp_path):
    res, _ = run_cluster_script(SCRIPT, tmp_path, lambda d: (d, free_port(), IDLE_LIMIT_S),
                                timeout=6 * IDLE_LIMIT_S, idle=IDLE_LIMIT_S, env=RAY_START_WINDOWS,
                                what="two-node search")
    assert len(res["cluster_nodes"]) == 2
    assert set(res["nodes"]) == set(res["cluster_nodes"])  # parts on both nodes
    assert all(res["nodes"].count(n) == 2 for n in res["cluster_nodes"])
    assert res["same"] and res["max_diff"] <= 1e-5 and res["second_same"]
    assert res["after_kill_same"]  # the dead actor's part made again and searched: the same run
    assert "search actors: part part-00" in res["too_big"] and "needs" in res["too_big"]
    assert res["ray_built"]  # the parts built as Ray tasks: the same index, the same answers
