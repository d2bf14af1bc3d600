"""torch.distributed for Ray Train, bound to the node's own address (loopback for a local run).

Ray Train's stock rendezvous (`TorchConfig(init_method="env")`) makes rank 0 start torch's
TCPStore, whose server binds the wildcard address (`::`), whatever MASTER_ADDR says: during a
local 2-worker run a RayTrainWorker then listened on every interface of the machine. Here the
rendezvous is the same in every other way, with two differences:

* rank 0 opens the store's listening socket itself, bound to its node's IP (what
  `ray.util.get_node_ip_address()` returns: 127.0.0.1 for the CLI's local Ray, the node's
  address on a cluster, where the other ranks must reach it), and hands it to the TCPStore
  server (`master_listen_fd`);
* gloo's transport binds each rank's node IP too (`ProcessGroupGloo.create_device`), instead of
  whatever the host name resolves to; NCCL's bootstrap socket is kept on the loopback interface
  when the node IP is loopback (`NCCL_SOCKET_IFNAME`, unless the user set it).

The integration tests of a 2-worker training run (test_train.py), a Tune sweep (test_tune.py) and
an ANCE run (test_ance_refresher.py) sample every listening socket of every process while it runs.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from ray.train.torch import TorchConfig
from ray.train.torch.config import _TorchBackend

_LISTENER: socket.socket | None = None  # rank 0's store socket, kept open for the store's lifetime


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


def open_store_socket() -> tuple[str, int]:
    """On rank 0: a listening TCP socket on this node's IP (never the wildcard); its (ip, port)."""
    global _LISTENER
    ip = _node_ip()
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((ip, 0))
    sock.listen(1024)  # ranks that connect before the store server starts wait in the backlog
    if _LISTENER is not None:
        _LISTENER.close()
    _LISTENER = sock
    return ip, sock.getsockname()[1]


def init_process_group(backend: str, world_rank: int, world_size: int, master_addr: str, master_port: int,
                       timeout_s: int) -> None:
    """Join the process group through a TCPStore on rank 0's node-IP socket."""
    import torch.distributed as dist
    from torch.distributed import ProcessGroupGloo

    timeout = timedelta(seconds=timeout_s)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)  # for libraries that read them
    is_master = world_rank == 0
    if is_master and _LISTENER is None:
        raise RuntimeError("rank 0 has no store socket (open_store_socket was not run on this worker)")
    store = dist.TCPStore(master_addr, master_port, world_size, is_master, timeout=timeout,
                          wait_for_workers=False,
                          **({"master_listen_fd": _LISTENER.fileno()} if is_master else {}))
    kwargs: dict = {}
    ip = _node_ip()
    if "nccl" in backend:
        if _is_loopback(ip):
            os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    else:
        opts = ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [ProcessGroupGloo.create_device(hostname=ip)]
        kwargs["pg_options"] = opts
    dist.init_process_group(backend=backend, store=store, rank=world_rank, world_size=world_size, timeout=timeout,
                            **kwargs)


class NodeBoundTorchBackend(_TorchBackend):
    """Ray Train's torch backend with the rendezvous above (shutdown, env vars as Ray's)."""

    def on_start(self, worker_group, backend_config: "NodeBoundTorchConfig"):
        import ray
        from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
        from ray.train.torch.config import _set_torch_distributed_env_vars

        backend = backend_config.backend
        if backend is None:
            gpus = worker_group.get_resources_per_worker().get("GPU", 0)
            backend = "nccl" if gpus > 0 else "gloo"
        addr, port = worker_group.execute_single(0, open_store_socket)
        if not isinstance(worker_group, V1WorkerGroup):  # as Ray's own backend: V2 sets them here
            worker_group.execute(_set_torch_distributed_env_vars)
        ray.get([worker_group.execute_single_async(i, init_process_group, backend=backend, world_rank=i,
                                                   world_size=len(worker_group), master_addr=addr,
                                                   master_port=port, timeout_s=backend_config.timeout_s)
                 for i in range(len(worker_group))])


@dataclass
class NodeBoundTorchConfig(TorchConfig):
    """`TorchConfig` whose store and gloo sockets bind the node's IP, never every interface."""

    @property
    def backend_cls(self):
        return NodeBoundTorchBackend
