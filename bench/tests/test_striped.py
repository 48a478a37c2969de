"""Striped transfers across a site's data-transfer nodes (issue 44), with namespaces as nodes:
three sending namespaces and three receiving ones, each node's link held to 300 Mbit/s, all
crossing one emulated 1 Gbit/s, 30 ms bottleneck, and sharing one directory as their file
system."""

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import pytest

from xfer_bench import dataplane, wan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")

MIB = 1 << 20


def _write_tree(root: Path) -> int:
    """Large files of several 16 MiB pieces and many small ones; their total size."""
    sizes = {f"large/f{i}.bin": size for i, size in enumerate([240 * MIB, 200 * MIB, 170 * MIB])}
    sizes |= {f"small/d{i % 10}/f{i:03}.dat": 100_000 + 3_001 * i for i in range(300)}
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
