import json
import os

import pytest

from xfer_bench import dataplane, netns, transports

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (network namespaces)")


def test_table_has_every_row():
    rows = [
        transports.Row("tcp via B", 4, 0.5, 1.0, 0.1, 0.2),
        transports.Row("mptcp", 4, 0.7, 1.4, 0.12, 0.25, 1.5, 1.25),
    ]
    table = transports.format_table(rows)
    assert "mptcp" in table and "1.40" in table and "0.250" in table and "1.25" in table


@needs_root
def test_mptcp_beats_the_faster_path_and_everything_is_removed(tmp_path, capsys):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    out = tmp_path / "rows.json"
    args = ["--reps", "1", "--size", "24MiB", "--rate-a", "50", "--rate-b", "100"]
    # The same build as the other one: the other build's QUIC runs and is reported apart.
    other = ["--other", str(xfer)]
    assert transports.main([*args, *other, "--streams", "2", "--json", str(out)]) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())}
    assert set(rows) == {
        "tcp via B",
        "tcp via A",
        "mptcp",
        "quic via B",
        "quic via B (other build)",
        "iperf3 via B",
    }
    assert 0.02 < rows["quic via B (other build)"]["gbps"] < 0.1, rows
    # Path B's htb rate bounds TCP, QUIC and iperf3 over it; MPTCP uses both paths.
    assert rows["tcp via B"]["gbps"] < 0.1
    assert 0.05 < rows["iperf3 via B"]["gbps"] < 0.1, rows
    assert 0.02 < rows["quic via B"]["gbps"] < 0.1, rows
    assert rows["mptcp"]["gbps"] > 0.1, rows
    assert rows["mptcp"]["vs_tcp_b"] > 1.0
    # The supervisor reports CPU in clock ticks (10 ms): one small run may read 0, all of
    # them together not.
    cpu = [r[k] for r in rows.values() for k in ("sender_cpu_per_gbit", "receiver_cpu_per_gbit")]
    assert all(c >= 0 for c in cpu) and sum(cpu) > 0, rows
    assert "reproduce: scripts/bench-transports" in capsys.readouterr().out
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"xm{os.getpid() % 100000}")]
