import json
import os

import pytest

from xfer_bench import cpu, dataplane, wan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


@needs_root
def test_both_builds_and_iperf3_fill_the_path_and_are_given_over_iperf3s_cpu(tmp_path, capsys):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    out = tmp_path / "rows.json"
    args = ["--rate", "100", "--rtt-ms", "10", "--reps", "1", "--size", "16MiB", "--streams", "2"]
    # The same build as the other one: it is run and reported apart.
    assert cpu.main([*args, "--other", str(xfer), "--json", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {"tcp via W", "iperf3 via W", "tcp via W (other build)"}
    # The bottleneck's 100 Mbit/s bounds every case.
    for row in rows.values():
        assert 0.03 < row["gbps"] < 0.105, rows
    assert rows["iperf3 via W"]["sender_cpu_vs_iperf3"] in (0.0, 1.0)
    # The supervisor reports CPU in clock ticks (10 ms): one small run may read 0, all of
    # them together not.
    cpu_s = [r[k] for r in rows.values() for k in ("sender_cpu_per_gbit", "receiver_cpu_per_gbit")]
    assert all(c >= 0 for c in cpu_s) and sum(cpu_s) > 0, rows
    printed = capsys.readouterr().out
    assert "reproduce: scripts/bench-cpu" in printed and "vs tcp" in printed
    assert wan.leftovers(f"xw{os.getpid() % 100000}") == []
