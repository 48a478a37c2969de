import os

import pytest

from xfer_bench import dataplane, netns, startup

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="loop mounts need root")


def test_human_sizes():
    assert startup.human(1 << 30) == "1 GiB"
    assert startup.human(100 << 40) == "100 TiB"
    assert startup.human(1000) == "1000 B"


def test_table_gives_the_memory_ratio():
    rows = [startup.Row("memory to memory", "1 GiB", "100 TiB", 0.06, 0.07, 16.0, 20.0)]
    assert "| 0.060 | 0.070 | 16.0 | 20.0 | 1.25 |" in startup.format_table(rows)


@needs_root
def test_sparse_ext4_holds_a_file_larger_than_the_disk_and_is_removed(tmp_path):
    root = tmp_path / "root"
    with netns.sparse_ext4(str(root), "2T"):
        huge = root / "huge"
        with huge.open("wb") as f:
            os.posix_fallocate(f.fileno(), 0, 1 << 40)
        assert huge.stat().st_size == 1 << 40
    assert not os.path.ismount(root)
    assert not os.path.exists(f"{root}.img")


@needs_root
def test_a_huge_transfer_starts_as_soon_and_holds_no_more_memory_than_a_small_one(tmp_path):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    cases = [
        # Small enough to be quick, large enough to carry data for several 50 ms intervals
        # at the benchmark's rate cap (4 x 800 Mbit/s) before it ends.
        startup.Case(startup.MEMORY, 256 << 20, 100 << 40),
        startup.Case(startup.SPARSE_FILE, 256 << 20, 1 << 40),
    ]
    rows = startup.measure(xfer, cases, 1, tmp_path)
    for row in rows:
        assert row.huge_first_data_s > 0 and row.small_first_data_s > 0
        # Before the queue cut units lazily, 100 TiB held 816 MiB against 17: far beyond this.
        assert row.rss_ratio < 2, startup.format_table(rows)
