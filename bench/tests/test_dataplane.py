import os
import subprocess

import pytest

from xfer_bench import dataplane, netns


def test_parse_size():
    assert dataplane.parse_size("4GiB") == 4 << 30
    assert dataplane.parse_size("512M") == 512 << 20
    assert dataplane.parse_size("1000") == 1000
    with pytest.raises(ValueError):
        dataplane.parse_size("lots")


def test_iperf3_report():
    report = {"end": {"sum_received": {"bits_per_second": 9.4e9}}}
    assert dataplane.iperf3_gbps(report) == pytest.approx(9.4)
    with pytest.raises(RuntimeError, match="unable to connect"):
        dataplane.iperf3_gbps({"error": "unable to connect"})


def test_xfer_summary():
    out = '{"type":"progress","t":1.0}\n{"type":"summary","gbit_per_s":12.5}\n'
    assert dataplane.xfer_summary_gbps(out) == 12.5
    with pytest.raises(RuntimeError):
        dataplane.xfer_summary_gbps('{"type":"progress"}\n')


def test_table_reports_ratios():
    rows = [dataplane.Row("veth", 4, 10.0, 8.0, 9.6, 7.6, 19.0)]
    table = dataplane.format_table(rows)
    assert "| veth | 4 | 10.00 | 9.60 | 0.96 | 8.00 | 7.60 | 0.95 | 0.76 | 19.00 | 0.40 |" in table


def test_iperf3_file_to_file_over_loopback(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(8 << 20))
    out = tmp_path / "out.bin"
    assert dataplane.run_iperf3(netns.LOOPBACK, 2, 1.0, (src, out)) > 0
    assert out.exists()


def test_local_copy_rate(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * (1 << 20))
    (tmp_path / "dst").mkdir()
    assert dataplane.local_copy_gbps(src, tmp_path / "dst") > 0
    copies = list((tmp_path / "dst").iterdir())
    assert len(copies) == 1 and copies[0].read_bytes() == src.read_bytes()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@needs_root
def test_veth_pair_carries_an_xfer_transfer_and_is_removed(tmp_path):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    with netns.veth_pair("xt") as topo:
        assert topo.sender_ns in netns.namespaces()
        with dataplane.xfer_receiver(xfer, topo, tmp_path) as rx:
            assert rx.addr.startswith("10.201.0.2:")
            key = dataplane.write_key_file(rx, tmp_path / "key")
            gbps = dataplane.run_xfer(topo, xfer, rx, 2, ["--mem", "64MiB", rx.addr], key)
        assert gbps > 0
    assert topo.sender_ns not in netns.namespaces()
    assert topo.receiver_ns not in netns.namespaces()


@needs_root
def test_veth_pair_is_removed_when_the_body_fails():
    with pytest.raises(RuntimeError), netns.veth_pair("xt") as topo:
        raise RuntimeError("boom")
    assert topo.sender_ns not in netns.namespaces()
    out = subprocess.run(["ip", "link"], capture_output=True, text=True, check=True).stdout
    assert "xt" + str(os.getpid() % 100000) not in out
