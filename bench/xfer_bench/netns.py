"""Network topologies on one machine: loopback, two namespaces joined by a veth pair, or
several on one bridge.

Namespaces and links carry a per-process suffix so concurrent runs do not collide, use only
private addresses inside the namespaces, and are deleted when the context exits, also on error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    """Where the sender and receiver run and how the sender reaches the receiver."""

    name: str
    receiver_addr: str
    sender_ns: str | None = None
    receiver_ns: str | None = None

    def sender_cmd(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` on the sender's side."""
        return _in_ns(self.sender_ns, argv)

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` on the receiver's side."""
        return _in_ns(self.receiver_ns, argv)


def _in_ns(ns: str | None, argv: Sequence[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv] if ns else list(argv)


LOOPBACK = Topology(name="loopback", receiver_addr="127.0.0.1")


def run_ip(*args: str) -> None:
    """Runs `ip ARGS...`, raising on failure."""
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextmanager
def namespace_pair(tag: str) -> Iterator[tuple[str, str]]:
    """A sender's and a receiver's namespace (`TAGs`, `TAGr`) with loopback up; deleted on
    exit, also when the body raises, and every link in them with them. Needs root."""
    snd, rcv = f"{tag}s", f"{tag}r"
    made: list[str] = []
    try:
        for ns in (snd, rcv):
            run_ip("netns", "add", ns)
            made.append(ns)
            run_ip("-n", ns, "link", "set", "lo", "up")
        yield snd, rcv
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@contextmanager
def veth_pair(prefix: str = "xb") -> Iterator[Topology]:
    """Two namespaces joined by a veth pair (10.201.0.1 sender, 10.201.0.2 receiver).

    Needs root. Everything made here is removed on exit, also when the body raises.
    """
    tag = f"{prefix}{os.getpid() % 100000}"
    with namespace_pair(tag) as (snd, rcv):
        run_ip(
            "link", "add", f"{tag}a", "netns", snd, "type", "veth", "peer", f"{tag}b", "netns", rcv
        )
        run_ip("-n", snd, "addr", "add", "10.201.0.1/30", "dev", f"{tag}a")
        run_ip("-n", rcv, "addr", "add", "10.201.0.2/30", "dev", f"{tag}b")
        run_ip("-n", snd, "link", "set", f"{tag}a", "up")
        run_ip("-n", rcv, "link", "set", f"{tag}b", "up")
        yield Topology(name="veth", receiver_addr="10.201.0.2", sender_ns=snd, receiver_ns=rcv)


@contextmanager
def bridged(tag: str, count: int, subnet: str = "10.202.0") -> Iterator[list[tuple[str, str]]]:
    """`count` namespaces (`TAG1`, `TAG2`, ...) on one bridge of this namespace (`TAGbr`, at
    `SUBNET.1`), as the hosts of one site's LAN: each namespace's name and its address
    (`SUBNET.11`, `SUBNET.12`, ...). Needs root. Everything made here is removed on exit, also
    when the body raises."""
    bridge = f"{tag}br"
    made: list[str] = []
    try:
        run_ip("link", "add", bridge, "type", "bridge")
        run_ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
        run_ip("link", "set", bridge, "up")
        hosts = []
        for i in range(1, count + 1):
            ns, addr = f"{tag}{i}", f"{subnet}.{10 + i}"
            run_ip("netns", "add", ns)
            made.append(ns)
            run_ip("link", "add", f"{tag}v{i}", "type", "veth", "peer", "eth0", "netns", ns)
            run_ip("link", "set", f"{tag}v{i}", "master", bridge, "up")
            run_ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            run_ip("-n", ns, "link", "set", "eth0", "up")
            run_ip("-n", ns, "link", "set", "lo", "up")
            hosts.append((ns, addr))
        yield hosts
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def tear_down_on_signals() -> None:
    """Makes SIGTERM unwind the stack like Ctrl-C does, and Ctrl-C work even where a shell
    started the command in the background (which leaves SIGINT ignored), so that a stopped
    command still removes every namespace, mount and process it made."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


HUGE_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"


@contextmanager
def tmpfs(path: str, size: str, huge: str = "always") -> Iterator[str]:
    """A tmpfs of `size` mounted at `path` (created), with huge pages where the kernel offers
    them (`huge`: tmpfs's huge= option, such as `always` or `within_size`); unmounted on exit.
    Needs root."""
    os.makedirs(path, exist_ok=True)
    options = f"size={size}" + (f",huge={huge}" if os.path.exists(HUGE_SHMEM) else "")
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "xfer-bench", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


@contextmanager
def sparse_ext4(path: str, size: str) -> Iterator[str]:
    """An ext4 file system of `size` (such as `2T`) mounted at `path` (created), on a sparse
    image file beside it: a receiver's root that accepts (and preallocates) files far larger
    than this machine's disk, as long as little is written. Unmounted and removed on exit.
    Needs root."""
    os.makedirs(path, exist_ok=True)
    image = f"{path}.img"
    subprocess.run(["truncate", "-s", size, image], check=True)
    try:
        lazy = "lazy_itable_init=1,lazy_journal_init=1"
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", lazy, image], check=True)
        subprocess.run(["mount", "-o", "loop", image, path], check=True)
        try:
            yield path
        finally:
            subprocess.run(["umount", path], capture_output=True)
    finally:
        os.remove(image)
