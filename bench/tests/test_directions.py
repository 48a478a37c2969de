import os
import shutil
from pathlib import Path

import pytest

from xfer_bench import dataplane, directions, wan


def test_the_table_gives_each_variants_median_its_ratio_to_push_and_every_run():
    rows = [
        directions.Row("push", [0.5, 0.6, 0.4], [3.0, 2.0, 4.0], 1.0),
        directions.Row("pull", [0.45, 0.3, 0.5], [5.0, 6.0, 7.0], 0.9),
    ]
    table = directions.format_table(rows)
    assert "| push | 0.500 | 1.000 | 3.0 | 0.500, 0.600, 0.400 |" in table
    assert "| pull | 0.450 | 0.900 | 6.0 | 0.450, 0.300, 0.500 |" in table


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
@pytest.mark.skipif(not Path("/usr/sbin/sshd").exists(), reason="needs openssh-server")
def test_each_direction_moves_the_file_over_ssh_and_is_timed(tmp_path):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    assert shutil.which("ssh-keygen")
    source, dest = tmp_path / "src" / "payload.bin", tmp_path / "dest"
    source.parent.mkdir()
    dest.mkdir()
    dataplane.write_payload(source, 8 << 20)
    spec = wan.WanSpec(rate_mbit=200, rtt_ms=4)
    with (
        wan.emulated_wan(spec, xfer, prefix="xdt") as w,
        directions.ssh_servers(w, tmp_path) as config,
    ):
        rows = directions.measure(w, xfer, config, source, dest, 1, ["--streams", "2"])
        # The last variant's copy is still there: the same bytes as the source.
        assert (dest / "payload.bin").read_bytes() == source.read_bytes()
    assert [r.variant for r in rows] == list(directions.VARIANTS)
    assert rows[0].over_push == 1.0
    for r in rows:
        assert len(r.gbps) == len(r.wall_s) == 1 and 0 < r.gbps[0] < 0.21
    assert not wan.leftovers("xdt")
