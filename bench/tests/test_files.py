import json
import os

import pytest

from xfer_bench import files, netns

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs, namespaces)")


def test_datasets_and_settings_parse_or_say_why():
    d = files.Dataset.parse("1000x4MiB")
    assert (d.count, d.size, d.total_bytes) == (1000, 4 << 20, 1000 * (4 << 20))
    assert files.Dataset.parse("3x5000").footprint == 3 * 8192
    assert files.Dataset.parse("2x16B").footprint == 2 * 4096
    for bad in ("1000", "0x4KiB", "ax4KiB", "10x4 parsecs"):
        with pytest.raises(ValueError):
            files.Dataset.parse(bad)
    variants = files.gridftp_variants("cc=64,p=1,pp; p=16")
    assert [v.label for v in variants] == ["gridftp -cc 64 -p 1 -pp", "gridftp -p 16"]
    for bad in ("cc=0", "cc=x", "pp=1", "bs=4"):
        with pytest.raises(ValueError):
            files.gridftp_variants(bad)


def test_generated_files_differ_and_have_their_size(tmp_path):
    top = files.Dataset.parse("1201x5").create(tmp_path)
    paths = sorted(p for p in top.rglob("*") if p.is_file())
    assert len(paths) == 1201 and len({p.parent for p in paths}) == 2
    contents = {p.read_bytes() for p in paths}
    assert len(contents) == 1201 and {len(c) for c in contents} == {5}
    assert files.arrived(top, 5) == 1201 and files.arrived(top, 6) == 0


def test_ratios_are_to_the_best_gridftp_setting_of_the_same_cell():
    def row(path, tool, fps, gbps=1.0):
        return files.Row(path, "10x1KiB", tool, 1.0, 10, True, fps, gbps, 0.1, 0.1)

    rows = [
        row("loopback", "xfer", 500),
        row("loopback", "gridftp -cc 8", 50),
        row("loopback", "gridftp -cc 64", 100),
        row("wan-50ms", "xfer", 300),
        row("wan-50ms", "gridftp -cc 64", 30),
    ]
    files.add_ratios(rows)
    assert [r.vs_gridftp for r in rows] == [5.0, 0.5, 1.0, 10.0, 1.0]
    table = files.format_table(rows)
    assert "5.00" in table and "10.00" in table
    failed = row("loopback", "gridftp -cc 512", 0)
    failed.complete, failed.error = False, "gridftp -cc 512 failed: FD_SETSIZE"
    assert "(failed: gridftp -cc 512 failed: FD_SETSIZE)" in files.format_table([failed])
    one = [row("loopback", "xfer", 1, 9.0), row("loopback", "xfer-mem", 0, 10.0)]
    assert files.disk_costs(one) == [
        "loopback 10x1KiB: xfer file to file at 0.90 x its " "memory-to-memory rate"
    ]
    rates = {"xxh3_gbit_per_s": 200.0, "blake3_gbit_per_s": 40.0}
    assert files.checksum_costs(rates, one) == [
        "checksums on one core: xxh3 200.0 Gbit/s (every chunk), BLAKE3 40.0 Gbit/s (every "
        "file, with --verify)",
        "fastest xfer run: 10.0 Gbit/s (loopback 10x1KiB xfer-mem); xxh3 at 20.0 x it, "
        "BLAKE3 at 4.0 x it",
    ]


@needs_root
def test_every_tool_moves_a_small_tree_over_loopback_and_the_wan(tmp_path, capsys):
    out = tmp_path / "rows.json"
    args = ["--datasets", "300x4KiB,1x8MiB", "--rtt-ms", "10", "--rate-mbit", "1000"]
    args += ["--gridftp-trees", "cc=4,p=1,pp", "--gridftp-file", "p=2", "--json", str(out)]
    assert files.main(args) == 0
    rows = json.loads(out.read_text())
    cells = {(r["path"], r["dataset"], r["tool"]) for r in rows}
    for path in ("loopback", "wan-10ms"):
        for tool in ("xfer", "gridftp -cc 4 -p 1 -pp", "rsync", "scp"):
            assert (path, "300x4KiB", tool) in cells
        assert (path, "1x8MiB", "xfer-mem") in cells
    assert all(r["complete"] for r in rows), rows
    trees = [r for r in rows if r["dataset"] == "300x4KiB"]
    assert all(r["files"] == 300 and r["files_per_s"] > 0 for r in trees)
    assert all(r["vs_gridftp"] > 0 for r in trees)
    # xfer reports its peak memory on both sides; the others do not.
    for r in rows:
        reported = r["tool"].startswith("xfer")
        assert (r["sender_rss_mib"] > 0, r["receiver_rss_mib"] > 0) == (reported, reported), r
    printed = capsys.readouterr().out
    assert "reproduce: scripts/bench-files" in printed and "memory-to-memory rate" in printed
    assert "checksums on one core: xxh3" in printed and "fastest xfer run" in printed
    assert not [ns for ns in netns.namespaces() if ns.startswith(f"xf{os.getpid() % 100000}")]


@needs_root
def test_on_a_disk_direct_io_leaves_the_page_cache_alone(tmp_path):
    out = tmp_path / "rows.json"
    disk = tmp_path / "disk"
    disk.mkdir()
    args = ["--datasets", "20x64KiB,1x64MiB", "--paths", "loopback", "--disk", str(disk)]
    args += ["--tools", "xfer,xfer-direct", "--json", str(out)]
    assert files.main(args) == 0
    rows = json.loads(out.read_text())
    cells = {(r["dataset"], r["tool"]): r for r in rows}
    assert set(cells) == {(d, t) for d in ("20x64KiB", "1x64MiB") for t in ("xfer", "xfer-direct")}
    assert all(r["complete"] for r in rows), rows
    # Through the page cache, the source is read into it and the copy written into it: at least
    # the file's size more than with direct I/O.
    buffered, direct = cells[("1x64MiB", "xfer")], cells[("1x64MiB", "xfer-direct")]
    assert buffered["cache_mib"] - direct["cache_mib"] >= 64, (buffered, direct)
    assert list(disk.iterdir()) == []
