"""A several-part index searched on Ray (`retrieve.runner=ray`): each part held by a search actor of its own,
placed where its memory is free, loaded once and searched for every batch of queries; the queries are sent to
every actor, each returns its top k, and the merge is the local one's (index/sharded.order), so the run is the
same as `retrieve.runner=local`'s.

Before any actor starts, the parts are placed on the nodes by the memory each asks for (Ray's `memory`
resource: the part's estimated bytes) and the plan is refused in one line naming the part and the number when a
part fits no node. An actor that dies is made again once and its part searched again; a second failure fails
the search, naming the part: a run never lacks a part's passages.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import PipelineError, ResourceError
from .sharded import ShardedIndex, order


@functools.lru_cache(maxsize=1)
def _actor_class():
    """The actor class, defined (and registered with Ray) once a process."""
    import ray

    @ray.remote
    class PartSearcher:
        """One part of an index, loaded once (faiss-gpu on a GPU actor where there is one)."""

        def __init__(self, index_dir: str, part: dict, index_cfg: dict):
            from pathlib import Path

            from ..config import IndexConfig
            from .sharded import ShardedIndex

            import json

            holder = ShardedIndex.__new__(ShardedIndex)
            holder.dir, holder.cfg, holder.resident, holder._loaded = Path(index_dir), IndexConfig(**index_cfg), \
                True, {}
            holder.meta = json.loads((Path(index_dir) / "index.json").read_text())
            self.part, self.metric = part, holder.meta.get("metric", "ip")
            self.index = holder.load_part(part)

        def search(self, queries, k: int):
            from .sharded import search_ordered

            s, i = search_ordered(self.index, queries, k, self.metric)
            return s, np.where(i >= 0, i + self.part["offset"], -1)

        def node(self) -> str:
            import ray

            return ray.get_runtime_context().get_node_id()

    return PartSearcher


def place_parts(parts: list[dict], nodes: list[dict]) -> list[int]:
    """First-fit-decreasing placement of the parts on nodes by memory ({"memory": bytes free}): the node index of
    each part; ResourceError naming the first part that fits no node."""
    free = [float(n.get("memory", 0)) for n in nodes]
    where = [0] * len(parts)
    for p in sorted(range(len(parts)), key=lambda j: -int(parts[j].get("bytes") or 0)):
        need = float(parts[p].get("bytes") or 0)
        best = max(range(len(free)), key=lambda j: free[j]) if free else None
        if best is None or free[best] + 1e-9 < need:
            most = max(free) if free else 0.0
            raise ResourceError(f"search actors: part {parts[p]['name']} needs ~{need / 2**30:.2f} GiB and the node "
                                f"with the most memory left has {most / 2**30:.2f} GiB (after the parts placed "
                                "before it); add nodes or memory, build more parts, or search one part at a time "
                                "(retrieve.runner=local)")
        free[best] -= need
        where[p] = best
    return where


def _nodes_memory() -> list[dict]:
    import ray

    out = []
    for n in ray.nodes():
        if n.get("Alive", n.get("alive", True)):
            out.append({"id": n.get("NodeID"), "memory": float(n.get("Resources", {}).get("memory", 0))})
    return out


class RaySearch:
    """A ShardedIndex searched by one actor per part (see the module doc); searchable as the index is."""

    def __init__(self, index: ShardedIndex, cfg, init: bool = True):
        import dataclasses

        import ray

        from ..ray_runtime import init_ray

        if init:
            init_ray(cfg.ray)
        self.sharded, self.meta, self.pids, self.index = index, index.meta, index.pids, index.index
        self.metric = index.metric
        self.resident = True
        self.dir = str(index.dir)
        self._cfg = dataclasses.asdict(cfg.index)
        nodes = _nodes_memory()
        self.nodes = place_parts(index.parts, nodes)
        self._gpus = 1.0 if cfg.index.use_gpu == "yes" else 0.0
        self._ids = [n["id"] for n in nodes]
        self.actors = [self._start(p) for p in range(len(index.parts))]
        ray.get([a.node.remote() for a in self.actors])  # every part loaded (a bad part fails here, named)

    def _start(self, p: int):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        part = self.sharded.parts[p]
        opts = {"num_cpus": 0.5, "num_gpus": self._gpus, "memory": max(int(part.get("bytes") or 0), 1)}
        if self._ids and self._ids[self.nodes[p]]:
            opts["scheduling_strategy"] = NodeAffinitySchedulingStrategy(self._ids[self.nodes[p]], soft=True)
        return _actor_class().options(**opts).remote(self.dir, part, self._cfg)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        import ray

        queries = np.ascontiguousarray(queries, dtype=np.float32)
        ref = ray.put(queries)
        pending = {p: a.search.remote(ref, k) for p, a in enumerate(self.actors)}
        got = {}
        for p, r in pending.items():
            try:
                got[p] = ray.get(r)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                name = self.sharded.parts[p]["name"]
                self.actors[p] = self._start(p)  # made again once, the part searched again
                try:
                    got[p] = ray.get(self.actors[p].search.remote(ref, k))
                except ray.exceptions.RayError as e:
                    raise PipelineError(f"the search actor of part {name} died and its second start failed too "
                                        f"({type(e).__name__}); no run is written without that part's "
                                        "passages") from None
        s = np.hstack([got[p][0] for p in range(len(self.actors))])
        i = np.hstack([got[p][1] for p in range(len(self.actors))])
        return order(s, i, k, self.metric)

    def node_of(self) -> list[str]:
        """The node each part's actor runs on."""
        import ray

        return ray.get([a.node.remote() for a in self.actors])

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []
