"""Every listening socket of a process tree, sampled while it runs (the loopback checks).

`ListenWatch(pid)` samples `pid` and all its descendants every `interval` seconds in a thread
until it is stopped, so sockets that live only for part of a run (a training worker's TCPStore,
a Tune trial's workers) are seen too.
"""

from __future__ import annotations

import ipaddress
import threading

import psutil


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped  # ::ffff:127.0.0.1 (a dual-stack socket bound to 127.0.0.1)
    return addr.is_loopback


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()).strip()
    except psutil.Error:
        return ""


def listening(procs) -> list[tuple[int, str, str, int]]:
    """(pid, name, ip, port) of every listening inet socket of `procs`."""
    out = []
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    out.append((p.pid, p.name(), c.laddr.ip, c.laddr.port))
        except psutil.Error:
            continue
    return out


class ListenWatch:
    """Samples the listening sockets of `root_pid`'s process tree until `stop()` (or the `with` ends)."""

    def __init__(self, root_pid: int, interval: float = 0.25):
        self.root = psutil.Process(root_pid)
        self.interval = interval
        self.sockets: set[tuple[int, str, int]] = set()  # (pid, ip, port) of every listening socket seen
        self.titles: dict[int, list[str]] = {}  # pid -> every command line it showed while listening
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listen-watch", daemon=True)

    def _sample(self) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        for pid, name, ip, port in listening(procs):
            self.sockets.add((pid, ip, port))
            try:  # a Ray worker's title changes (ray::IDLE, then ray::RayTrainWorker): keep every one seen
                title = cmdline(psutil.Process(pid)) or name
            except psutil.Error:
                title = name
            if title not in self.titles.setdefault(pid, []):
                self.titles[pid].append(title)
        self.samples += 1

    def _titles(self, pid: int) -> str:
        return " | ".join(self.titles.get(pid, []))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def start(self) -> "ListenWatch":
        self._thread.start()
        return self

    def stop(self) -> "ListenWatch":
        self._stop.set()
        self._thread.join()
        return self

    def __enter__(self) -> "ListenWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def exposed(self) -> list[str]:
        return [f"{self._titles(pid)[:200]} (pid {pid}) on {ip}:{port}" for pid, ip, port in sorted(self.sockets)
                if not is_loopback(ip)]

    def owners(self, needle: str) -> int:
        """How many sockets were seen in processes whose command line contains `needle`."""
        return sum(needle in self._titles(pid) for pid, _, _ in self.sockets)

    def summary(self) -> str:
        procs = {pid for pid, _, _ in self.sockets}
        return (f"{len(self.sockets)} listening sockets in {len(procs)} processes over {self.samples} samples; "
                f"beyond loopback: {len(self.exposed())}")

    def assert_loopback_only(self, *owners: str) -> None:
        """Nothing listened beyond loopback, and each of `owners` (a command-line fragment) was seen listening."""
        assert self.samples >= 2, "the watch took fewer than two samples: the run ended before it looked"
        for needle in owners:
            assert self.owners(needle), f"no listening socket of a {needle!r} process was seen: {self.summary()}"
        exposed = self.exposed()
        assert exposed == [], "listening beyond loopback:\n" + "\n".join(exposed)
