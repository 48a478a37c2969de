import os
import shutil

import pytest

from xfer_bench import against, dataplane, wan

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="tmpfs needs root")


def test_the_table_gives_medians_their_ratio_the_fastest_runs_ratio_and_every_run():
    row = against.Row(4, "file", [10.0, 2.0, 12.0], [11.0, 13.0, 3.0])
    assert row.ratio == pytest.approx(11.0 / 10.0)
    assert row.best_ratio == pytest.approx(13.0 / 12.0)
    table = against.format_table([row])
    line = "| 4 | file | 10.00 | 11.00 | 1.100 | 1.083 | 10, 2, 12; 11, 13, 3 |"
    assert line in table


@pytest.fixture
def builds(tmp_path):
    """This build, a copy of it as the other build, and a work directory."""
    this = dataplane.DEFAULT_XFER
    assert this.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    other = tmp_path / "other" / "xfer"
    other.parent.mkdir()
    shutil.copy2(this, other)
    work = tmp_path / "work"
    work.mkdir()
    return other, this, work


@needs_root
def test_two_builds_run_alternately_and_every_transfer_is_counted(builds):
    other, this, work = builds
    rows = against.measure(other, this, [2], 2, 64 << 20, 256 << 20, work)
    assert [(r.streams, r.kind) for r in rows] == [(2, "file"), (2, "mem")]
    for r in rows:
        assert len(r.other_gbps) == len(r.this_gbps) == 2
        assert all(g > 0 for g in r.other_gbps + r.this_gbps), r
    # Over QUIC, both ends of both builds.
    quic = work / "quic"
    quic.mkdir()
    rows = against.measure(other, this, [2], 1, 16 << 20, 64 << 20, quic, transport="quic")
    assert all(g > 0 for r in rows for g in r.other_gbps + r.this_gbps), rows


@needs_root
def test_over_the_emulated_path_both_builds_run_at_the_links_rate(builds):
    other, this, work = builds
    path = wan.WanSpec(rate_mbit=100, rtt_ms=10)
    rows = against.measure(other, this, [2], 1, 8 << 20, 8 << 20, work, wan=path)
    assert [(r.streams, r.kind) for r in rows] == [(2, "file"), (2, "mem")]
    # The 100 Mbit/s bottleneck bounds every run, file or memory, either build.
    assert all(0.02 < g < 0.105 for r in rows for g in r.other_gbps + r.this_gbps), rows
    assert wan.leftovers(f"xa{os.getpid() % 100000}") == []
