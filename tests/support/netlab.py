"""An emulated WAN on one Linux host: network namespaces joined by rate-limited veth links through routers.

:class:`Lab` makes namespaces (each node its own network stack), veth links between them with
an address on each end and an optional ``tbf`` rate limit in both directions, routers (IP
forwarding), NAT routers (``iptables -t nat ... MASQUERADE``; inbound connections to the inside
are dropped, outbound ones work), partitions (a link's ``iptables DROP`` on a router, healed
later) and processes started inside a namespace (``ip netns exec``). Every name it makes starts
with a prefix holding this process's PID, so parallel labs never collide; :meth:`Lab.close` (run on
leaving the ``with`` block, on SIGINT/SIGTERM, and at exit) stops every process it started by PID,
then any process still inside one of its namespaces, then deletes its namespaces (which deletes
their veth ends). Nothing it did not create is touched.

What it does not emulate: latency and jitter (``netem`` is missing on these kernels), packet loss,
MTU differences, asymmetric routes and real NAT timeouts.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

REQUIRED_TOOLS = ("ip", "tc", "iptables")
_lab_numbers = itertools.count()


class NetlabUnavailableError(RuntimeError):
    """Network namespaces (or the tools to wire them) cannot be made on this host."""


def namespaces_unavailable() -> str | None:
    """Why this host cannot build a lab (one line naming the fix), or None when it can."""
    if os.geteuid() != 0:
        return "network namespaces need root: run the lab as root (CI runs as root)"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: install iproute2 and iptables (apt-get install iproute2 iptables)"
    probe = f"nlprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace ({done.stderr.strip()}): run on a Linux host that allows it"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done


@dataclass
class Namespace:
    name: str
    """The namespace's full name (with the lab's prefix)."""
    role: str
    """The short name the lab was given (e.g. ``worker-0``)."""
    addresses: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        """Its first address (the end of its first link)."""
        return self.addresses[0]

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["ip", "netns", "exec", self.name, *argv], check)


@dataclass
class Link:
    a: Namespace
    b: Namespace
    a_dev: str
    b_dev: str
    a_address: str
    b_address: str
    rate_mbit: float | None


class Lab:
    """Namespaces, links and processes of one emulated WAN; a context manager that tears it all down."""

    def __init__(self, root: Path, prefix: str | None = None) -> None:
        reason = namespaces_unavailable()
        if reason is not None:
            raise NetlabUnavailableError(reason)
        self.root = root
        self.prefix = prefix or f"nl{os.getpid()}x{next(_lab_numbers)}"
        self.namespaces: dict[str, Namespace] = {}
        self.links: list[Link] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._num_subnets = 0
        self._closed = False
        self._old_handlers: dict[int, object] = {}

    def __enter__(self) -> Lab:
        if threading.current_thread() is threading.main_thread():  # signal handlers live in the main thread only
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._old_handlers[signum] = signal.signal(signum, self._on_signal)
        atexit.register(self.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Unwind through the caller's finally blocks; close() then runs from __exit__ (or atexit).
        raise KeyboardInterrupt(f"signal {signum}")

    # -- topology --------------------------------------------------------------------------------

    def namespace(self, role: str) -> Namespace:
        name = f"{self.prefix}-{role}"
        run(["ip", "netns", "add", name])
        ns = Namespace(name, role)
        self.namespaces[role] = ns
        ns.exec("ip", "link", "set", "lo", "up")
        return ns

    def router(self, role: str) -> Namespace:
        ns = self.namespace(role)
        ns.exec("sysctl", "-qw", "net.ipv4.ip_forward=1")
        return ns

    def link(self, a: Namespace, b: Namespace, rate_mbit: float | None = None, subnet: str | None = None) -> Link:
        """A veth pair between ``a`` and ``b`` on its own /24 (``b`` gets .1, ``a`` .2), rate-limited both ways."""
        index = len(self.links)
        self._num_subnets += 1
        net = ipaddress.ip_network(subnet or f"10.{200 + self._num_subnets // 250}.{self._num_subnets % 250}.0/24")
        a_dev, b_dev = f"v{index}a", f"v{index}b"
        run(["ip", "link", "add", a_dev, "netns", a.name, "type", "veth", "peer", "name", b_dev, "netns", b.name])
        hosts = list(net.hosts())
        b_addr, a_addr = str(hosts[0]), str(hosts[1])
        for ns, dev, addr in ((a, a_dev, a_addr), (b, b_dev, b_addr)):
            ns.exec("ip", "addr", "add", f"{addr}/{net.prefixlen}", "dev", dev)
            ns.exec("ip", "link", "set", dev, "up")
            ns.addresses.append(addr)
            if rate_mbit is not None:
                # tbf on each end's egress: both directions limited. The bucket holds ~4 ms of traffic
                # (at least 64 KiB) so that the kernel timer resolution does not cap the rate.
                burst = max(65536, int(rate_mbit * 1e6 / 8 * 0.004))
                ns.exec(
                    "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit}mbit",
                    "burst", str(burst), "latency", "100ms",
                )  # fmt: skip
        link = Link(a, b, a_dev, b_dev, a_addr, b_addr, rate_mbit)
        self.links.append(link)
        return link

    def default_route(self, ns: Namespace, via: str) -> None:
        ns.exec("ip", "route", "replace", "default", "via", via)

    def route(self, ns: Namespace, destination: str, via: str) -> None:
        ns.exec("ip", "route", "replace", destination, "via", via)

    def nat(self, router: Namespace, uplink: Link, inside: Sequence[Link]) -> None:
        """Make ``router`` a NAT: traffic from the ``inside`` links leaves by ``uplink`` masqueraded as the
        router's uplink address; connections from outside to the inside are dropped."""
        out_dev = uplink.a_dev if uplink.a is router else uplink.b_dev
        for link in inside:
            in_dev = link.b_dev if link.b is router else link.a_dev
            subnet = str(ipaddress.ip_interface(f"{link.b_address}/24").network)
            router.exec("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", subnet, "-o", out_dev, "-j", "MASQUERADE")
            router.exec(
                "iptables", "-A", "FORWARD", "-i", out_dev, "-o", in_dev,
                "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT",
            )  # fmt: skip
            router.exec("iptables", "-A", "FORWARD", "-i", out_dev, "-o", in_dev, "-j", "DROP")

    def partition(self, link: Link) -> None:
        """Drop every packet crossing ``link`` (both ends), as a cut cable would; :meth:`heal` undoes it."""
        for ns, dev in ((link.a, link.a_dev), (link.b, link.b_dev)):
            ns.exec("iptables", "-I", "INPUT", "-i", dev, "-j", "DROP")
            ns.exec("iptables", "-I", "FORWARD", "-i", dev, "-j", "DROP")

    def heal(self, link: Link) -> None:
        for ns, dev in ((link.a, link.a_dev), (link.b, link.b_dev)):
            ns.exec("iptables", "-D", "INPUT", "-i", dev, "-j", "DROP")
            ns.exec("iptables", "-D", "FORWARD", "-i", dev, "-j", "DROP")

    # -- processes -------------------------------------------------------------------------------

    def start(
        self,
        ns: Namespace,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        stdout: int | None = None,
        stdin: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """``argv`` inside ``ns``, logging to ``<root>/<name>.log``; ``ip netns exec`` execs it, so the PID is the
        program's own."""
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        self._logs.append(log)
        proc = subprocess.Popen(
            ["ip", "netns", "exec", ns.name, *argv],
            stdout=stdout if stdout is not None else log,
            stderr=log,
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL one process this lab started (a crash: nothing is cleaned up)."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL once ``timeout_s`` passed."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(proc)

    def pids_inside(self) -> list[int]:
        """Processes still running inside this lab's namespaces (children of its nodes included)."""
        pids: list[int] = []
        for ns in self.namespaces.values():
            done = run(["ip", "netns", "pids", ns.name], check=False)
            pids += [int(pid) for pid in done.stdout.split() if pid.isdigit()]
        return pids

    # -- teardown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every process (by PID), then delete every namespace this lab made; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)
        # Interrupting teardown would leave namespaces behind: ignore the signals until it is done.
        for signum in self._old_handlers:
            signal.signal(signum, signal.SIG_IGN)
        try:
            live = [proc for proc in self.procs if proc.poll() is None]
            for proc in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in live:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
            for pid in self.pids_inside():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for ns in reversed(list(self.namespaces.values())):
                run(["ip", "netns", "del", ns.name], check=False)
            self.namespaces.clear()
            for log in self._logs:
                log.close()
        finally:
            for signum, handler in self._old_handlers.items():
                signal.signal(signum, handler)  # type: ignore[arg-type]


def lab_namespaces(prefix: str) -> list[str]:
    """Names of the namespaces on this host that start with ``prefix`` (tests check teardown with it)."""
    done = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in done.stdout.splitlines() if line.startswith(prefix)]


@contextlib.contextmanager
def lab(root: Path, prefix: str | None = None) -> Iterator[Lab]:
    with Lab(root, prefix) as built:
        yield built
