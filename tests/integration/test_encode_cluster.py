"""Two-node simulation (`ray.cluster_utils.Cluster`): encoder actors on both nodes write their
own shards; every passage is encoded exactly once and no vector passes through the driver.

The cluster runs in a subprocess so it never meets the session-scoped local Ray of the
other integration tests (a process can be connected to one Ray at a time).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

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

    tmp, model = Path(sys.argv[1]), sys.argv[2]
    rng = random.Random(0)
    (tmp / "c.tsv").write_text("".join(f"{i}\\t{' '.join(rng.choice('ab cd ef gh'.split()) for _ in range(rng.randint(3, 40)))}\\n"
                                      for i in range(120)))
    ingest([tmp / "c.tsv"], "msmarco", tmp / "corpus", part_rows=30, progress=False)

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1",
        "object_store_memory": 100 * 2**20})
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=100 * 2**20)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        received = []
        real_collect = encode_mod._collect

        def spy_collect(ds, todo_rows, show_progress):
            original = ds.iter_batches

            def iter_batches(*a, **k):
                for batch in original(*a, **k):
                    received.append({c: [v.dtype.kind, int(v.nbytes), list(v.shape)] for c, v in batch.items()})
                    yield batch

            ds.iter_batches = iter_batches
            return real_collect(ds, todo_rows, show_progress)

        encode_mod._collect = spy_collect
        cfg = load_config(None, [f"model.name_or_path={model}", "model.pooling=mean", "encode.num_actors=2",
                                 "encode.cpus_per_actor=1", "encode.shard_rows=15", "encode.batch_size=8",
                                 "encode.show_progress=false"])
        summary = encode_mod.encode_corpus(tmp / "corpus", tmp / "emb", cfg)
        nodes = sorted({json.loads(p.read_text())["node"] for p in (tmp / "emb").glob("shard-*.done")})
        pids = [p for ids, _ in iter_shards(tmp / "emb") for p in ids]
        alive = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        print("RESULT " + json.dumps({"summary": summary, "shard_nodes": nodes, "cluster_nodes": alive,
                                      "pids": pids, "received": received}))
    finally:
        ray.shutdown()
        cluster.shutdown()
''')


def test_two_nodes_write_their_own_shards_every_pid_once(tiny_model_dir, tmp_path):
    # its own process group: whatever happens, every Ray process the simulation started is ended
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path), str(tiny_model_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"two-node encode did not finish in 180 s:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, stdout[-3000:] + stderr[-6000:]
    res = json.loads(lines[0][len("RESULT "):])
    assert res["summary"]["actors"] == 2 and res["summary"]["shards"] == 8
    assert len(res["cluster_nodes"]) == 2
    assert res["shard_nodes"] == res["cluster_nodes"]  # both nodes' actors wrote shards
    assert sorted(res["pids"], key=int) == [str(i) for i in range(120)] and len(set(res["pids"])) == 120
    # the driver received one small receipt per shard: a name, a row count, seconds; no vectors
    assert sum(len(b["rows"][2]) and b["rows"][2][0] for b in res["received"]) == 8
    for batch in res["received"]:
        assert set(batch) == {"name", "rows", "seconds"}
        assert all(len(shape) == 1 for _, _, shape in batch.values())
        assert sum(nbytes for _, nbytes, _ in batch.values()) < 1024
