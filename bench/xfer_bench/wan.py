"""An emulated wide-area path on one machine.

Senders, a router and a receiver each get a network namespace. Data goes through the kernel
all the way: sender -> veth -> router (htb bottleneck with a burst of at least 2 ms of the rate,
a byte-limited bfifo drop-tail buffer, nftables random loss) -> veth -> receiver. The round-trip
delay sits on the reverse (ACK) path: either netem on the router, where the kernel has it, or
`xfer-harness delay-line`, which carries the receiver's packets to each sender through a pair
of TUN devices after the delay.

What makes the delay line keep time on a two-core machine: it runs with real-time priority on
the last CPU, and RPS steers every device's receive processing to the other CPUs, because
writing a packet into a TUN device runs whatever network softirq work is pending on the
writer's CPU (without this, packets leave up to 100 ms late). Segmentation offloads are off on
the senders' links, so drop-tail and random loss hit single segments as on a real router,
not 64 KB GSO super-packets. The senders accept packets arriving on the TUN device although
their route to the receiver goes through the router (rp_filter off). While a path exists,
each CPU may queue 10,000 packets for its network softirq rather than the host's default 1,000
(`net.core.netdev_max_backlog`, a setting of the whole host, put back on exit): with every
hop of several node pairs handed to the softirq of two CPUs, a burst of a few hundred
microseconds overflows 1,000 and its packets are dropped as no router on the path would.

Everything is made under a per-process tag and removed on exit, also after an error or
Ctrl-C; the delay line is stopped and its statistics kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from xfer_bench.dataplane import DEFAULT_XFER, harness_beside
from xfer_bench.netns import Topology, namespaces

RECEIVER_ADDR = "10.212.200.1"
#: Where `ip netns exec NS` finds files to mount over /etc (here: hosts).
NETNS_ETC = Path("/etc/netns")
#: Socket buffer limit in every namespace: enough for one stream to fill 10 Gbit/s at 50 ms.
SOCKET_BUFFER_MAX = 64 << 20


def sender_addr(index: int) -> str:
    """Address of sender `index` (from 0)."""
    return f"10.212.{index + 1}.1"


def receiving_node_addr(index: int) -> str:
    """Address of receiving node `index` (from 0), behind the receiver's namespace."""
    return f"10.213.{index + 1}.1"


@dataclass(frozen=True)
class WanSpec:
    """The path: bottleneck rate, round-trip time, buffer, random loss, number of senders, and
    the receiving site's nodes."""

    rate_mbit: float
    rtt_ms: float
    #: Drop-tail buffer: bytes (`4MiB`, `500000`) or a multiple of the bandwidth-delay product
    #: (`1bdp`, `0.5bdp`).
    buffer: str = "1bdp"
    #: Share of data segments dropped at random on the way to the receiver (0 to 1).
    loss: float = 0.0
    senders: int = 1
    #: `delay-line`, `netem`, or `auto` (netem where the kernel has it).
    delay: str = "auto"
    #: Round-trip time changing at given seconds: ((0, 50), (60, 100)) (delay line only).
    rtt_schedule: tuple[tuple[float, float], ...] = field(default=())
    #: TCP congestion control of the senders (the host's default is not used: it may be BBR,
    #: which ignores random loss).
    congestion: str = "cubic"
    #: Receiving nodes (a site's data-transfer nodes) behind the receiver's namespace, which
    #: then routes for them; 0: the receiver's namespace receives itself.
    receiving_nodes: int = 0
    #: The rate of each sender's and each receiving node's own link (its NIC), Mbit/s; None:
    #: only the bottleneck limits.
    node_rate_mbit: float | None = None

    def __post_init__(self) -> None:
        if not (self.rate_mbit > 0 and self.rtt_ms >= 0):
            raise ValueError("the rate must be positive and the RTT at least 0")
        if not 0 <= self.loss < 1:
            raise ValueError(f"loss {self.loss} is not a rate between 0 and 1")
        if self.senders < 1:
            raise ValueError("at least one sender")
        if self.receiving_nodes < 0:
            raise ValueError("receiving nodes: 0 or more")
        if self.node_rate_mbit is not None and not self.node_rate_mbit > 0:
            raise ValueError("a node's rate must be positive")
        if self.delay not in ("auto", "delay-line", "netem"):
            raise ValueError(f"delay {self.delay!r}: expected auto, delay-line or netem")
        self.buffer_bytes()

    def bdp_bytes(self) -> float:
        """Bandwidth-delay product in bytes."""
        return self.rate_mbit * 1e6 / 8 * self.rtt_ms / 1e3

    def buffer_bytes(self) -> int:
        """The buffer in bytes (at least two full-size packets)."""
        text = self.buffer.strip().lower()
        if m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*bdp", text):
            size = float(m.group(1)) * self.bdp_bytes()
        elif m := re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?", text):
            size = float(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2)]
        else:
            raise ValueError(f"buffer {self.buffer!r} is not bytes (4MiB) or a BDP multiple (1bdp)")
        return max(int(size), 3000)


@dataclass
class Wan:
    """A running emulated path."""

    spec: WanSpec
    tag: str
    senders: list[str]
    router: str
    receiver: str
    delay_mode: str
    #: The receiving nodes' namespaces (`WanSpec.receiving_nodes`).
    nodes: list[str] = field(default_factory=list)
    #: Process id of the delay line while it runs (None with netem).
    delay_line_pid: int | None = None
    delay_stats: list[dict] = field(default_factory=list)

    def topology(self, index: int = 0) -> Topology:
        """Sender `index` and the receiver, as the other harness modules use them."""
        return Topology(
            name=f"wan-{self.spec.rate_mbit:g}mbit-{self.spec.rtt_ms:g}ms",
            receiver_addr=RECEIVER_ADDR,
            sender_ns=self.senders[index],
            receiver_ns=self.receiver,
        )

    def node_topology(self, sender: int, node: int) -> Topology:
        """Sender `sender` and receiving node `node`: one pair of a site's nodes."""
        return Topology(
            name=f"wan-{self.spec.rate_mbit:g}mbit-{self.spec.rtt_ms:g}ms-node{node}",
            receiver_addr=receiving_node_addr(node),
            sender_ns=self.senders[sender],
            receiver_ns=self.nodes[node],
        )

    def sender_cmd(self, index: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` in sender `index`'s namespace."""
        return ["ip", "netns", "exec", self.senders[index], *argv]

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs `argv` in the receiver's namespace."""
        return ["ip", "netns", "exec", self.receiver, *argv]

    def set_rate(self, rate_mbit: float) -> None:
        """Changes the bottleneck rate now (for schedules); the buffer keeps its size."""
        _tc(self.router, "class", "change", *_htb_class(self._bottleneck_dev, rate_mbit))

    def set_loss(self, loss: float) -> None:
        """Drops this share of the data segments at random from now on (nftables, on the way
        into the bottleneck's buffer); 0 drops none."""
        if not 0 <= loss < 1:
            raise ValueError(f"loss {loss} is not a rate between 0 and 1")
        threshold = round(loss * 1_000_000)
        rules = (
            f"table ip {self.tag} {{\n chain loss {{\n"
            "  type filter hook forward priority 0;\n }\n}\n"
            f"flush chain ip {self.tag} loss\n"
        )
        if threshold > 0:
            rules += (
                f'add rule ip {self.tag} loss oifname "{self._bottleneck_dev}" '
                f"numgen random mod 1000000 < {threshold} drop\n"
            )
        _run(self.router, "nft", "-f", "-", stdin=rules)

    def restart_rtt_schedule(self) -> None:
        """Makes the delay line count its RTT schedule's times from now (when the transfer it
        measures starts); without a delay line there is no schedule to restart."""
        if self.delay_line_pid is not None:
            os.kill(self.delay_line_pid, signal.SIGUSR1)

    @property
    def _bottleneck_dev(self) -> str:
        return f"{self.tag}rc"


def _run(ns: str | None, *argv: str, stdin: str | None = None) -> str:
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    out = subprocess.run(cmd, capture_output=True, text=True, input=stdin)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()}")
    return out.stdout


def _ip(*args: str) -> None:
    _run(None, "ip", *args)


def _tc(ns: str, *args: str) -> None:
    _run(ns, "tc", *args)


def _sysctl(ns: str, **settings: str) -> None:
    _run(ns, "sysctl", "-qw", *(f"{k.replace('__', '.')}={v}" for k, v in settings.items()))


AVAILABLE_CC = "/proc/sys/net/ipv4/tcp_available_congestion_control"
ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def _set_congestion_control(ns: str, name: str) -> None:
    """Makes `name` the default congestion control in `ns`. A namespace may only choose one the
    host allows, so `name` is added to the host's allowed list when missing (a note says so)."""
    available = Path(AVAILABLE_CC).read_text().split()
    if name not in available:
        raise RuntimeError(f"congestion control {name} is not available here: {available}")
    allowed = Path(ALLOWED_CC).read_text().split()
    if name not in allowed:
        Path(ALLOWED_CC).write_text(" ".join([*allowed, name]))
        print(f"xfer-bench: note: added {name} to {ALLOWED_CC}", file=sys.stderr)
    _sysctl(ns, net__ipv4__tcp_congestion_control=name)


def _veth(devices: list[tuple[str, str]], a: tuple[str, str, str], b: tuple[str, str, str]) -> None:
    """A veth pair between two namespaces, `(namespace, device, address/prefix)` at each end,
    both ends up and appended to `devices`."""
    (a_ns, a_dev, _), (b_ns, b_dev, _) = a, b
    _ip("link", "add", a_dev, "netns", a_ns, "type", "veth", "peer", b_dev, "netns", b_ns)
    for ns, dev, addr in (a, b):
        _ip("-n", ns, "addr", "add", addr, "dev", dev)
        _ip("-n", ns, "link", "set", dev, "up")
        devices.append((ns, dev))


def _htb_class(dev: str, rate_mbit: float) -> list[str]:
    # A burst of at least 2 ms of the rate: tc's default collapses throughput with many streams.
    burst = max(int(rate_mbit * 1e6 / 8 * 0.002), 32 * 1514)
    rate = f"{rate_mbit * 1e6:.0f}bit"
    return ["dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", rate,
            "burst", str(burst), "cburst", str(burst)]  # fmt: skip


def add_htb(ns: str, dev: str, rate_mbit: float) -> None:
    """Holds `dev`'s egress in namespace `ns` to `rate_mbit` with an htb root qdisc of one
    class (`1:1`, which `Wan.set_rate` changes)."""
    _tc(ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1")
    _tc(ns, "class", "add", *_htb_class(dev, rate_mbit))


def netem_available() -> bool:
    """Whether this kernel can add a netem qdisc (tried on a throwaway namespace's loopback)."""
    ns = f"xwprobe{os.getpid() % 100000}"
    try:
        _ip("netns", "add", ns)
        _run(ns, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
        return True
    except RuntimeError:
        return False
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _cpu_plan() -> tuple[int | None, str]:
    """The CPU for the delay line and the RPS mask (hex) of the CPUs left for the stacks."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, "0"
    mask = sum(1 << c for c in cpus[:-1])
    return cpus[-1], f"{mask:x}"


def _steer_rps(ns: str, dev: str, mask: str) -> None:
    _run(
        ns,
        "sh",
        "-c",
        f"for q in /sys/class/net/{dev}/queues/rx-*; do echo {mask} > $q/rps_cpus; done",
    )


def add_path_options(p: argparse.ArgumentParser) -> None:
    """A benchmark's options for the emulated path it runs on (`path_spec` reads them): the
    bottleneck's rate, the round-trip time and the buffer."""
    p.add_argument("--rate", type=float, default=600, help="bottleneck rate, Mbit/s")
    p.add_argument("--rtt-ms", type=float, default=30, help="round-trip time, ms")
    p.add_argument("--buffer", default="1bdp", help="drop-tail buffer: bytes or a BDP multiple")


def path_spec(p: argparse.ArgumentParser, args: argparse.Namespace) -> WanSpec:
    """The path of `add_path_options`, or a usage error."""
    try:
        return WanSpec(rate_mbit=args.rate, rtt_ms=args.rtt_ms, buffer=args.buffer)
    except ValueError as e:
        p.error(str(e))


@contextmanager
def emulated_wan(spec: WanSpec, xfer: Path = DEFAULT_XFER, prefix: str = "xw") -> Iterator[Wan]:
    """Builds the path of `spec`, yields it, and removes it on exit. Needs root."""
    tag = f"{prefix}{os.getpid() % 100000}"
    senders = [f"{tag}s{i}" for i in range(spec.senders)]
    router, receiver = f"{tag}r", f"{tag}c"
    nodes = [f"{tag}n{j}" for j in range(spec.receiving_nodes)]
    mode = spec.delay
    if mode == "auto":
        mode = "netem" if netem_available() else "delay-line"
    elif mode == "netem" and not netem_available():
        raise ValueError("this kernel has no netem qdisc: use delay = 'delay-line' or 'auto'")
    if spec.rtt_schedule and mode != "delay-line":
        raise ValueError("an RTT schedule needs the delay line (delay = 'delay-line')")
    made: list[str] = []
    line: subprocess.Popen[str] | None = None
    wan = Wan(spec, tag, senders, router, receiver, mode, nodes)
    backlog = _raise_backlog(10_000)
    try:
        for ns in [*senders, router, receiver, *nodes]:
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _sysctl(
                ns,
                net__ipv4__tcp_rmem=f"4096 131072 {SOCKET_BUFFER_MAX}",
                net__ipv4__tcp_wmem=f"4096 16384 {SOCKET_BUFFER_MAX}",
                net__core__rmem_max=str(SOCKET_BUFFER_MAX),
                net__core__wmem_max=str(SOCKET_BUFFER_MAX),
            )
        _sysctl(router, net__ipv4__ip_forward="1")
        if nodes:
            # The receiver routes for its nodes; their replies leave through the delay line's
            # device, not the one the data came in by, so reverse-path filtering is off.
            _sysctl(
                receiver,
                net__ipv4__ip_forward="1",
                net__ipv4__conf__all__rp_filter="0",
                net__ipv4__conf__default__rp_filter="0",
            )
        # Names for the path's addresses, which `ip netns exec` mounts over /etc/hosts in each
        # namespace, the host's name meaning the namespace's own address: tools that look
        # their own address up (GridFTP) find it without DNS.
        hosts = ["127.0.0.1 localhost", f"{RECEIVER_ADDR} receiver"]
        hosts += [f"{sender_addr(i)} sender{i}" for i in range(spec.senders)]
        hosts += [f"{receiving_node_addr(j)} node{j}" for j in range(len(nodes))]
        own = {receiver: RECEIVER_ADDR, **{ns: sender_addr(i) for i, ns in enumerate(senders)}}
        own |= {ns: receiving_node_addr(j) for j, ns in enumerate(nodes)}
        for ns in made:
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            mine = [f"{own[ns]} {socket.gethostname()}"] if ns in own else []
            (etc / "hosts").write_text("\n".join([*hosts, *mine]) + "\n")
        cpu, rps_mask = _cpu_plan()
        devices: list[tuple[str, str]] = []
        for i, ns in enumerate(senders):
            s_dev = f"{tag}s{i}a"
            router_end = (router, f"{tag}r{i}", f"10.212.{i + 1}.2/24")
            _veth(devices, (ns, s_dev, f"{sender_addr(i)}/24"), router_end)
            _ip("-n", ns, "route", "add", "default", "via", f"10.212.{i + 1}.2")
            _run(ns, "ethtool", "-K", s_dev, "tso", "off", "gso", "off")
            _sysctl(
                ns, net__ipv4__conf__all__rp_filter="0", net__ipv4__conf__default__rp_filter="0"
            )
            _set_congestion_control(ns, spec.congestion)
            if spec.node_rate_mbit is not None:
                add_htb(ns, s_dev, spec.node_rate_mbit)
        rc_dev = wan._bottleneck_dev
        receiver_end = (receiver, f"{tag}ca", f"{RECEIVER_ADDR}/24")
        _veth(devices, (router, rc_dev, "10.212.200.2/24"), receiver_end)
        for j, ns in enumerate(nodes):
            c_node = f"{tag}c{j}"
            node_end = (ns, f"{tag}n{j}a", f"{receiving_node_addr(j)}/24")
            _veth(devices, (receiver, c_node, f"10.213.{j + 1}.2/24"), node_end)
            _ip("-n", ns, "route", "add", "default", "via", f"10.213.{j + 1}.2")
            if spec.node_rate_mbit is not None:
                add_htb(receiver, c_node, spec.node_rate_mbit)
        if nodes:
            _ip("-n", router, "route", "add", "10.213.0.0/16", "via", RECEIVER_ADDR)
        add_htb(router, rc_dev, spec.rate_mbit)
        _tc(router, "qdisc", "add", "dev", rc_dev, "parent", "1:1", "handle", "10:", "bfifo",
            "limit", str(spec.buffer_bytes()))  # fmt: skip
        if spec.loss > 0:
            wan.set_loss(spec.loss)
        if mode == "netem":
            _ip("-n", receiver, "route", "add", "10.212.0.0/16", "via", "10.212.200.2")
            for i in range(spec.senders):
                _tc(router, "qdisc", "add", "dev", f"{tag}r{i}", "root", "netem", "delay",
                    f"{spec.rtt_ms}ms", "limit", "1000000")  # fmt: skip
        else:
            links = []
            for i, ns in enumerate(senders):
                tun_c, tun_s = f"{tag}d{i}c", f"{tag}d{i}s"
                for n, d in ((receiver, tun_c), (ns, tun_s)):
                    _ip("-n", n, "tuntap", "add", "dev", d, "mode", "tun")
                    _ip("-n", n, "link", "set", d, "up")
                    devices.append((n, d))
                _ip("-n", receiver, "route", "add", f"10.212.{i + 1}.0/24", "dev", tun_c)
                _sysctl(ns, **{f"net__ipv4__conf__{tun_s}__rp_filter": "0"})
                links.append(f"{receiver}/{tun_c}={ns}/{tun_s}")
            argv = [str(harness_beside(xfer)), "delay-line", "--realtime"]
            for link in links:
                argv += ["--link", link]
            if spec.rtt_schedule:
                steps = ",".join(f"{t:g}s:{rtt:g}ms" for t, rtt in spec.rtt_schedule)
                argv += ["--schedule", steps]
            else:
                argv += ["--delay", f"{spec.rtt_ms:g}ms"]
            if cpu is not None:
                argv += ["--cpu", str(cpu)]
            line = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert line.stdout is not None
            if line.stdout.readline().strip() != "ready":
                line.wait(timeout=5)
                raise RuntimeError(f"xfer-harness delay-line did not start: {line.stderr.read()}")
            wan.delay_line_pid = line.pid
        if cpu is not None:
            for n, d in devices:
                _steer_rps(n, d, rps_mask)
        yield wan
    finally:
        if line is not None:
            line.send_signal(signal.SIGTERM)
            try:
                out, _ = line.communicate(timeout=5)
                wan.delay_stats = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
            except subprocess.TimeoutExpired:
                line.kill()
                line.wait()
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
        BACKLOG.write_text(backlog)


#: Packets each CPU may queue for its network softirq (host-wide).
BACKLOG = Path("/proc/sys/net/core/netdev_max_backlog")


def _raise_backlog(packets: int) -> str:
    """Makes the host's softirq backlog at least `packets`; returns the setting to put back."""
    before = BACKLOG.read_text().strip()
    if int(before) < packets:
        BACKLOG.write_text(str(packets))
    return before


def leftovers(prefix: str = "xw") -> list[str]:
    """Namespaces (and their /etc/netns entries) that an emulated path with `prefix` left."""
    etc = [p.name for p in NETNS_ETC.glob(f"{prefix}*")] if NETNS_ETC.exists() else []
    return sorted({*(ns for ns in namespaces() if ns.startswith(prefix)), *etc})
