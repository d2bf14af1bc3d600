"""Every listening socket of a process tree, sampled while it runs (the loopback checks).

`ListenWatch(pid)` samples `pid` and all its descendants every `interval` seconds in a thread
until it is stopped, so sockets that live only for part of a run (a training worker's TCPStore,
a Tune trial's workers) are seen too.

A sample reads the listening TCP sockets once from /proc/net/tcp and tcp6 and looks for their owners among the
tree's processes (their /proc/<pid>/fd) only when a socket or a process is new: psutil's per-process
`net_connections` parses those tables once per process, ~8 ms of CPU each, which for a sweep's 30-40 processes
every 0.25 s kept a core busy beside the run it watched (835 ms a sample over 105 processes, 2026-12-04).
"""

from __future__ import annotations

import ipaddress
import os
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


def listening_sockets() -> dict[int, tuple[str, int]]:
    """inode -> (ip, port) of every listening TCP socket of this network namespace (/proc/net/tcp and tcp6)."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/net/{table}", encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: TCP_LISTEN
                continue
            addr, port = fields[1].split(":")
            raw = bytes.fromhex(addr)  # each 32-bit word in the kernel's (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.ip_address(raw)
            mapped = getattr(ip, "ipv4_mapped", None)  # written as psutil writes it: ::ffff:127.0.0.1
            out[int(fields[9])] = (f"::ffff:{mapped}" if mapped else str(ip), int(port, 16))
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets `pid` holds open (none when it has ended or cannot be read)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(int(target[8:-1]))
    return found


class ListenWatch:
    """Samples the listening sockets of `root_pid`'s process tree until `stop()` (or the `with` ends)."""

    def __init__(self, root_pid: int, interval: float = 0.25):
        self.root = psutil.Process(root_pid)
        self.interval = interval
        self.sockets: set[tuple[int, str, int]] = set()  # (pid, ip, port) of every listening socket seen
        self.titles: dict[int, list[str]] = {}  # pid -> every command line it showed while listening
        self.samples = 0
        self._owner: dict[int, int] = {}  # listening socket inode -> the pid of the tree holding it
        self._looked: tuple = ()  # (unowned inodes, tree pids) of the last look for owners
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listen-watch", daemon=True)

    def _sample(self) -> None:
        try:
            pids = {self.root.pid} | {p.pid for p in self.root.children(recursive=True)}
        except psutil.Error:
            return
        sockets = listening_sockets()
        self._owner = {i: pid for i, pid in self._owner.items() if i in sockets and pid in pids}
        unowned = frozenset(i for i in sockets if i not in self._owner)  # new, or another tree's (another Ray's)
        if unowned and self._looked != (unowned, pids):
            for pid in pids:
                for inode in socket_inodes(pid) & unowned:
                    self._owner[inode] = pid
            self._looked = (frozenset(i for i in unowned if i not in self._owner), pids)
        for inode, pid in self._owner.items():
            ip, port = sockets[inode]
            self.sockets.add((pid, ip, port))
            try:  # a Ray worker's title changes (ray::IDLE, then ray::RayTrainWorker): keep every one seen
                proc = psutil.Process(pid)
                title = cmdline(proc) or proc.name()
            except psutil.Error:
                continue
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
