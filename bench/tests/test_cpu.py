import json
import os

import pytest

from xfer_bench import cpu, dataplane, own_cpu, wan

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
    # Each side was sampled, and its own CPU is part of what it was charged (one clock tick of
    # 10 ms per run is 0.075 s per Gbit of 16 MiB).
    for row in rows.values():
        for side in ("sender", "receiver"):
            own = row[f"{side}_own_cpu_per_gbit"]
            assert 0 < own <= row[f"{side}_cpu_per_gbit"] + 0.15, (side, row)
    printed = capsys.readouterr().out
    assert "reproduce: scripts/bench-cpu" in printed and "snd own vs" in printed
    assert wan.leftovers(f"xw{os.getpid() % 100000}") == []


@needs_root
def test_a_missing_other_build_is_refused_before_any_path_is_made(tmp_path, capsys):
    xfer = tmp_path / "xfer"
    xfer.touch()
    with pytest.raises(SystemExit) as refused:
        cpu.main(["--xfer", str(xfer), "--other", str(tmp_path / "no-such-xfer")])
    assert refused.value.code == 2
    assert "no-such-xfer does not exist" in capsys.readouterr().err


SYSCALL = "\tffffffff8226b1a0 do_syscall_64\n\tffffffff82400130 entry_SYSCALL_64_after_hwframe\n"


def test_samples_through_the_softirq_handler_are_not_the_processs_own():
    copy = "\tffffffff81a0 _copy_from_iter\n\tffffffff81b0 tcp_sendmsg\n" + SYSCALL
    # A softirq run as a system call enables them again: the interrupt's work all the same.
    softirq = "\tffffffff81c0 htb_dequeue\n\tffffffff81d0 handle_softirqs\n" + SYSCALL
    user = "\t           14ab0 xxh3_64\n"
    script = "\n\n".join([copy, softirq, user, softirq]) + "\n\n\n"
    assert own_cpu.own_seconds_in(script, "x") == 2 * own_cpu.PERIOD_NS / 1e9


def test_samples_without_kernel_symbols_are_refused():
    unresolved = "\tffffffff81a0 [unknown]\n\t    14ab0 xxh3_64\n"
    with pytest.raises(RuntimeError, match="no kernel symbols"):
        own_cpu.own_seconds_in(unresolved + "\n\n" + unresolved, "run.perf")
    assert own_cpu.own_seconds_in("", "empty.perf") == 0
