"""Striped transfers across a site's data-transfer nodes (issue 44), with namespaces as nodes:
three sending namespaces and three receiving ones, each node's link held to 300 Mbit/s, all
crossing one emulated 1 Gbit/s, 30 ms bottleneck, and sharing one directory as their file
system: each node started by hand against iperf3 over the same pairs, and the head
(`xfer send --nodes`) starting them all over ssh with a node pair failing mid-transfer."""

import json
import os
import resource
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from xfer_bench import dataplane, sshd, wan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

MIB = 1 << 20


def _write_tree(root: Path, large_mib: tuple[int, ...] = (240, 200, 170), small: int = 300) -> int:
    """Large files of several 16 MiB pieces and many small ones; their total size."""
    sizes = {f"large/f{i}.bin": size * MIB for i, size in enumerate(large_mib)}
    sizes |= {f"small/d{i % 10}/f{i:03}.dat": 100_000 + 3_001 * i for i in range(small)}
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out:
            out.write(os.urandom(size))
    return sum(sizes.values())


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def work(tmp_path):
    """The test's directory, removed after it: pytest keeps the last runs' directories, and
    this one holds the tree twice over (1.6 GB)."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@needs_root
def test_a_striped_tree_over_three_node_pairs_fills_the_bottleneck(work):
    tmp_path = work
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    src = tmp_path / "src" / "run7"
    total = _write_tree(src)
    spec = wan.WanSpec(
        rate_mbit=1000, rtt_ms=30, senders=3, receiving_nodes=3, node_rate_mbit=300,
        delay="delay-line",
    )  # fmt: skip
    (tmp_path / "dst").mkdir()
    with wan.emulated_wan(spec, prefix="xws") as w, ExitStack() as stack:
        nodes = []
        for i in range(3):
            topo = w.node_topology(i, i)
            rx = stack.enter_context(dataplane.xfer_receiver(xfer, topo, tmp_path / "dst"))
            nodes.append((topo, rx, dataplane.write_key_file(rx, tmp_path / f"key{i}")))

        def send(i: int, count: int, dest: str) -> dict:
            topo, rx, key = nodes[i]
            argv = [str(xfer), "send", str(src), f"{rx.addr}:{dest}", "--key-file", str(key)]
            argv += ["--stripe", f"{i}/{count}", "--json"]
            out = subprocess.run(topo.sender_cmd(argv), capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            return dataplane.xfer_summary(out.stdout)

        # One node pair alone, with the share it has among three.
        alone = send(0, 3, "alone")
        alone_mbit = alone["bytes"] * 8 / alone["seconds"] / 1e6
        shutil.rmtree(tmp_path / "dst" / "alone")
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            summaries = list(pool.map(lambda i: send(i, 3, "striped"), range(3)))
        seconds = time.monotonic() - started
        # The reference: iperf3 moving as many bytes over the three pairs at once, memory to
        # memory, timed the same way (from its start, ramp-up included).
        share = total // 3
        started = time.monotonic()
        with ThreadPoolExecutor(3) as pool:
            list(
                pool.map(
                    lambda i: dataplane.iperf3_report(nodes[i][0], 4, 0, amount=share), range(3)
                )
            )
        iperf3_mbit = 3 * share * 8 / (time.monotonic() - started) / 1e6
    striped_mbit = total * 8 / seconds / 1e6
    assert _tree(tmp_path / "dst" / "striped" / "run7") == _tree(src)
    assert sum(s["bytes"] for s in summaries) == total, summaries
    print(
        f"one pair {alone_mbit:.1f} Mbit/s, three striped {striped_mbit:.1f} Mbit/s, iperf3 over "
        f"the three at once {iperf3_mbit:.1f} (payload)"
    )
    assert alone_mbit <= 1.05 * 300, alone_mbit
    # Floors that catch a regression (a node's share lost, spurious drops), not the targets:
    # in eight runs here three pairs carried 0.83 to 1.03 of what iperf3 carries over them
    # (iperf3: 755 to 832 of the 900; both lose the rest to ramp-up, headers and six hosts
    # sharing two CPUs), and in six of them 2.71 to 3.27 times what one pair does. Every run's
    # figures: docs/experiments/2026-12-07-striped-transfers.md.
    assert striped_mbit >= 0.8 * 3 * alone_mbit, (striped_mbit, alone_mbit)
    assert striped_mbit >= 0.75 * iperf3_mbit, (striped_mbit, iperf3_mbit)
    assert wan.leftovers("xws") == []


def _pids(ns: str, holding: str) -> list[int]:
    """The processes in namespace `ns` whose command line holds `holding`."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, check=True)
    found = []
    for pid in out.stdout.split():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if holding in cmd:
            found.append(int(pid))
    return found


def _children_cpu_s() -> float:
    """User and system CPU seconds of this process's ended children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _links_down(ns: str) -> None:
    """Takes every link of namespace `ns` down, as a node whose cable is pulled."""
    out = subprocess.run(["ip", "-n", ns, "-o", "link", "show"], capture_output=True, text=True)
    for line in out.stdout.splitlines():
        dev = line.split(": ")[1].split("@")[0]
        if dev != "lo":
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "down"], check=True)


@needs_root
@pytest.mark.parametrize("failure", ["sender killed", "receiving link down"])
def test_the_head_starts_the_pairs_over_ssh_and_a_failed_node_is_taken_over(work, failure):
    # The same path, every node with an sshd: `xfer send --nodes` on sending node 0 (the
    # head) starts a sender on each sending node and a receiver on each receiving node over
    # ssh. Once data moves, node pair 1 fails: its sender is killed, or every link of its
    # receiving node goes down (noticed by the sender's stall timeout, 3 s here). Another pair
    # takes its stripe over and the tree arrives identical.
    tmp_path = work
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    src = tmp_path / "src" / "run7"
    total = _write_tree(src, large_mib=(64, 48, 40), small=100)
    dst = tmp_path / "dst"
    spec = wan.WanSpec(
        rate_mbit=1000, rtt_ms=30, senders=3, receiving_nodes=3, node_rate_mbit=300,
        delay="delay-line",
    )  # fmt: skip
    (tmp_path / "ssh").mkdir()
    with wan.emulated_wan(spec, prefix="xwh") as w:
        servers = {f"s{i}": (w.senders[i], wan.sender_addr(i)) for i in range(3)}
        servers |= {f"r{i}": (w.nodes[i], wan.receiving_node_addr(i)) for i in range(3)}
        with sshd.ssh_servers(servers, tmp_path / "ssh") as config:
            nodes = tmp_path / "nodes"
            nodes.write_text("".join(f"s{i} r{i}\n" for i in range(3)))
            mi_log = tmp_path / "mi.jsonl"
            argv = [str(xfer), "send", "--nodes", str(nodes), str(src), str(dst), "--json"]
            argv += ["--ssh-command", f"ssh -F {config}", "--remote-xfer", str(xfer)]
            # Held to 100 Mbit/s a pair, so that the transfer lasts seconds after the kill.
            argv += ["--rate-limit", "100Mbit", "--mi-log", str(mi_log), "--stall-timeout", "3s"]
            started, cpu = time.monotonic(), _children_cpu_s()
            head = subprocess.Popen(
                w.sender_cmd(0, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            failed_at = None
            for line in head.stdout:
                report = json.loads(line)
                if report["type"] == "progress" and report["bytes_acked"] > 0:
                    failed_at = report["t"]
                    break
            assert failed_at is not None, head.stderr.read()
            if failure == "sender killed":
                victims = _pids(w.senders[1], "send --over-ssh")
                assert len(victims) == 1, victims
                os.kill(victims[0], 9)
            else:
                _links_down(w.nodes[1])
            rest, err = head.communicate(timeout=120)
            seconds, cpu = time.monotonic() - started, _children_cpu_s() - cpu
    assert head.returncode == 0, err
    summary = json.loads(rest.splitlines()[-1])
    assert _tree(dst / "run7") == _tree(src)
    runs = summary["runs"]
    failed = [r for r in runs if "failed" in r]
    assert [r["node"] for r in failed] == [1], runs
    took = [r for r in runs if r.get("took_over_from") == 1]
    assert len(took) == 1 and took[0]["stripe"] == "1/3" and "failed" not in took[0], runs
    assert summary["bytes"] + summary["bytes_skipped"] == total, summary
    records = [json.loads(line) for line in mi_log.read_text().splitlines()]
    assert {r["node"] for r in records} >= {0, 2}, "the MI log names each record's node"
    print(
        f"head over ssh: {total * 8 / seconds / 1e6:.1f} Mbit/s wall ({summary['seconds']:.2f} s "
        f"on the head's clock); pair 1 failed ({failure}) at {failed_at:.2f} s, its stripe "
        f"started over pair {took[0]['node']} at {took[0]['started']:.2f} s"
    )
    print(f"  the head's CPU, its ssh clients included: {cpu:.2f} s, {cpu / total * 1e9:.2f} s/GB")
    for r in runs:
        print(
            f"  node {r['node']} stripe {r['stripe']}: {r['bytes'] / MIB:.1f} MiB from "
            f"{r['started']:.2f} to {r['ended']:.2f} s{' (failed)' if 'failed' in r else ''}"
        )
    assert wan.leftovers("xwh") == []
