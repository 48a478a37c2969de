import json
import os

import pytest

from xfer_bench import dataplane, protection

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a tmpfs mount)")


def test_ratios_are_medians_against_plain():
    runs = {"plain": [10.0, 20.0, 12.0], "integrity": [6.0, 5.0, 9.0], "encrypt": [3.0, 3.0, 4.0]}
    row = protection.row_of("file", 4, runs)
    assert (row.plain_gbps, row.integrity_gbps, row.encrypt_gbps) == (12.0, 6.0, 3.0)
    assert row.integrity_ratio == 0.5 and row.encrypt_ratio == 0.25
    table = protection.format_table([row])
    assert "| file | 4 | 12.00 | 6.00 | 3.00 | 0.50 | 0.25 |" in table


@needs_root
def test_a_short_run_measures_every_mode(tmp_path, capsys):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    out = tmp_path / "rows.json"
    args = ["--reps", "1", "--size", "64MiB", "--streams", "1,2", "--json", str(out)]
    assert protection.main(args) == 0
    rows = json.loads(out.read_text())
    assert [(r["source"], r["streams"]) for r in rows] == [
        ("file", 1),
        ("file", 2),
        ("memory", 1),
        ("memory", 2),
    ]
    assert all(r[f"{m}_gbps"] > 0 for r in rows for m in protection.MODES)
    assert "reproduce: scripts/bench-protection" in capsys.readouterr().out
