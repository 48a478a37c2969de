import shutil

import pytest

from xfer_bench import dataplane, rerun


def test_the_same_seed_writes_the_same_tree(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    total = rerun.write_tree(a, 7, 10, 50, seed=3)
    assert rerun.write_tree(b, 7, 10, 50, seed=3) == total
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 7
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert sum((a / f).stat().st_size for f in files) == total


def test_the_table_gives_each_commands_median_its_ratio_and_every_run():
    rows = [
        rerun.Row("rsync -a -c", [0.4, 0.5, 0.3], 1.0),
        rerun.Row("xfer --checksum", [0.6, 0.5, 0.7], 1.5),
    ]
    table = rerun.format_table(rows)
    assert "| rsync -a -c | 0.400 | 1.00 | 0.400, 0.500, 0.300 |" in table
    assert "| xfer --checksum | 0.600 | 1.50 | 0.600, 0.500, 0.700 |" in table


def test_a_rerun_that_sends_or_misses_a_file_is_refused():
    summary = '{"type": "summary", "bytes": 0, "compared": {"files": 5, "changed": 0}}'
    rerun.check_nothing_sent("xfer --checksum", summary, 5)
    with pytest.raises(RuntimeError, match="compared"):
        rerun.check_nothing_sent("xfer --checksum", summary, 6)
    with pytest.raises(RuntimeError, match="sent 9 bytes"):
        rerun.check_nothing_sent("xfer", summary.replace('"bytes": 0', '"bytes": 9'), 5)


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs rsync")
def test_every_command_reruns_the_identical_tree_and_is_timed(tmp_path):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    rerun.write_tree(tmp_path / "src" / "tree", 40, 100, 5000, seed=1)
    rows, first = rerun.measure([("xfer", xfer)], tmp_path, 40, reps=2, first_reps=1)
    assert [r.command for r in rows] == ["rsync -a -c", "xfer --checksum", "xfer"]
    assert rows[0].over_reference == 1.0
    assert all(len(r.wall_s) == 2 and min(r.wall_s) > 0 for r in rows)
    assert {c: len(runs) for c, runs in first.items()} == {"xfer --checksum": 1, "xfer": 1}
    landed = tmp_path / "xfer-root" / "t"
    assert sorted(p.name for p in landed.rglob("f*")) == sorted(
        p.name for p in (tmp_path / "src" / "tree").rglob("f*")
    )
