import json
import os
import re
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from xfer_bench import dataplane, wan, wan_commands

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
#: Bytes on the wire per full segment: payload plus TCP (with timestamps), IP and Ethernet headers.
MSS, WIRE = 1448, 1448 + 32 + 20 + 14


def test_buffer_sizes():
    spec = wan.WanSpec(rate_mbit=1000, rtt_ms=50)
    assert spec.bdp_bytes() == 6_250_000
    assert spec.buffer_bytes() == 6_250_000
    assert wan.WanSpec(rate_mbit=1000, rtt_ms=50, buffer="0.5bdp").buffer_bytes() == 3_125_000
    assert wan.WanSpec(rate_mbit=100, rtt_ms=10, buffer="4MiB").buffer_bytes() == 4 << 20
    assert wan.WanSpec(rate_mbit=100, rtt_ms=0).buffer_bytes() == 3000, "never below 2 packets"
    bad_specs = [dict(buffer="lots"), dict(loss=1.5), dict(senders=0), dict(delay="magic")]
    bad_specs += [dict(receiving_nodes=-1), dict(node_rate_mbit=0)]
    for bad in bad_specs:
        with pytest.raises(ValueError):
            wan.WanSpec(rate_mbit=100, rtt_ms=10, **bad)


def _iperf3(w: wan.Wan, streams: int, seconds: int, omit: int = 0) -> dict:
    return dataplane.iperf3_report(w.topology(), streams, seconds, omit=omit)["end"]


@needs_root
@pytest.mark.parametrize("rtt_ms", [10, 50])
def test_idle_rtt_is_within_1ms_of_the_setting(rtt_ms):
    spec = wan.WanSpec(rate_mbit=100, rtt_ms=rtt_ms, delay="delay-line")
    with wan.emulated_wan(spec, prefix="xwt") as w:
        argv = ["ping", "-n", "-c", "20", "-i", "0.02", wan.RECEIVER_ADDR]
        out = subprocess.run(w.sender_cmd(0, argv), capture_output=True, text=True, check=True)
    rtts = sorted(float(m) for m in re.findall(r"time=([\d.]+) ms", out.stdout))
    assert len(rtts) == 20, out.stdout
    assert rtt_ms <= rtts[0] < rtt_ms + 1, rtts
    assert rtts[len(rtts) // 2] < rtt_ms + 1, rtts
    assert w.delay_stats and w.delay_stats[0]["packets"] >= 20


@needs_root
def test_bottleneck_rate_holds_within_5_percent_also_after_a_change():
    spec = wan.WanSpec(rate_mbit=100, rtt_ms=10, delay="delay-line")
    with wan.emulated_wan(spec, prefix="xwt") as w:
        before = _iperf3(w, streams=4, seconds=4, omit=1)
        w.set_rate(50)
        after = _iperf3(w, streams=4, seconds=4, omit=1)
    for end, rate in ((before, 100), (after, 50)):
        wire_mbit = _wire_mbit(end)
        assert 0.95 * rate <= wire_mbit <= 1.05 * rate, (rate, wire_mbit)


def _wire_mbit(end: dict) -> float:
    """What an iperf3 report's receiver got, counted on the wire (headers included), Mbit/s."""
    return end["sum_received"]["bits_per_second"] * WIRE / MSS / 1e6


@needs_root
def test_node_pairs_each_held_to_their_own_link_fill_the_bottleneck_together():
    # A site's three data-transfer nodes to the other's three (issue 44): each node's link
    # holds it to 300 Mbit/s, the path they share carries 1000.
    spec = wan.WanSpec(
        rate_mbit=1000, rtt_ms=30, senders=3, receiving_nodes=3, node_rate_mbit=300,
        delay="delay-line",
    )  # fmt: skip
    with wan.emulated_wan(spec, prefix="xwt") as w:
        # Measured for 10 s after 3 s left out: after a loss a pair's CUBIC takes about 5 s to
        # regrow its window at 300 Mbit/s and 30 ms, so over 5 s one early loss decided the
        # sum (a pair at 137 and at 199 Mbit/s in two CI runs of 2026-12-07).
        def pair(i: int) -> dict:
            return dataplane.iperf3_report(w.node_topology(i, i), 4, 10, omit=3)["end"]

        alone = _wire_mbit(pair(0))
        with ThreadPoolExecutor(3) as pool:
            together = [_wire_mbit(end) for end in pool.map(pair, range(3))]
    assert 0.9 * 300 <= alone <= 1.05 * 300, alone
    assert all(rate <= 1.05 * 300 for rate in together), together
    assert sum(together) >= 0.9 * 900, together
    assert wan.leftovers("xwt") == []


@needs_root
def test_xfer_per_stream_caps_hold(tmp_path):
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    spec = wan.WanSpec(rate_mbit=100, rtt_ms=10, delay="delay-line")
    with wan.emulated_wan(spec, prefix="xwt") as w:
        topo = w.topology()
        with dataplane.xfer_receiver(xfer, topo, tmp_path) as rx:
            # Two streams capped at 20 Mbit/s each on a 100 Mbit/s path: 40 Mbit/s (TCP paces
            # the payload); 25 MB take about 5 s.
            key = dataplane.write_key_file(rx, tmp_path / "key")
            argv = [str(xfer), "send", "--mem", "25MB", rx.addr, "--key-file", str(key), "--json"]
            argv += ["--streams", "2", "--stream-rate-cap", "20", "--unit-size", "1MiB"]
            out = subprocess.run(topo.sender_cmd(argv), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    # Judge the steady part: bytes TCP saw acknowledged from the first progress line to the
    # last but one (per-stream kernel counters; the transfer's own count moves in units, and at
    # the very end one stream may run out of units before the other).
    progress = [x for x in lines if x["type"] == "progress"]
    assert len(progress) >= 3, lines

    def acked(p: dict) -> int:
        return sum(s["bytes_acked"] for s in p["tcp"])

    first, last = progress[0], progress[-2]
    mbit = (acked(last) - acked(first)) * 8 / (last["t"] - first["t"]) / 1e6
    # The caps must hold: at most 5 % over them. Below them, the rate over these few seconds
    # varies on this shared 2-core VM: 37.9 to 40.0 Mbit/s in six runs on an idle machine
    # (2026-11-29), and under 38 now and then with the delay line of either build (inside xfer,
    # and xfer-harness's). 36 still catches a stream held back or a cap applied twice.
    assert 36 <= mbit <= 42, mbit


@needs_root
def test_configured_loss_appears_as_retransmissions():
    spec = wan.WanSpec(rate_mbit=100, rtt_ms=10, loss=0.02, delay="delay-line")
    with wan.emulated_wan(spec, prefix="xwt") as w:
        end = _iperf3(w, streams=4, seconds=3)
    segments = end["sum_sent"]["bytes"] / MSS
    share = end["sum_sent"]["retransmits"] / segments
    assert 0.012 <= share <= 0.04, (share, end["sum_sent"])


@needs_root
def test_nothing_is_left_after_a_run_that_fails():
    with pytest.raises(RuntimeError, match="on purpose"):
        with wan.emulated_wan(wan.WanSpec(rate_mbit=10, rtt_ms=5, senders=2), prefix="xwt") as w:
            assert len(w.senders) == 2 and all(ns in wan.leftovers("xwt") for ns in w.senders)
            raise RuntimeError("failed on purpose")
    assert wan.leftovers("xwt") == []
    with pytest.raises(RuntimeError, match="nosuchcc"):
        with wan.emulated_wan(
            wan.WanSpec(rate_mbit=10, rtt_ms=5, congestion="nosuchcc"), prefix="xwt"
        ):
            pass
    assert wan.leftovers("xwt") == []
    if not wan.netem_available():
        # Asking for netem where the kernel has none is named, not a tc error.
        with pytest.raises(ValueError, match="no netem qdisc"):
            with wan.emulated_wan(wan.WanSpec(rate_mbit=10, rtt_ms=5, delay="netem"), prefix="xwt"):
                pass
        assert wan.leftovers("xwt") == []
    lines = subprocess.run(["pgrep", "-af", "delay-line"], capture_output=True, text=True).stdout
    assert "xwt" not in lines, lines


@needs_root
def test_an_rtt_schedule_changes_the_delay_on_time():
    spec = wan.WanSpec(
        rate_mbit=100, rtt_ms=10, delay="delay-line", rtt_schedule=((0, 10), (2, 40))
    )
    with wan.emulated_wan(spec, prefix="xwt") as w:
        rtts = []
        for wait in (0, 2.5):
            time.sleep(wait)
            argv = ["ping", "-n", "-c", "5", "-i", "0.05", wan.RECEIVER_ADDR]
            out = subprocess.run(w.sender_cmd(0, argv), capture_output=True, text=True).stdout
            rtts.append(sorted(float(m) for m in re.findall(r"time=([\d.]+) ms", out)))
    # The delay line is a user-space process: on a busy machine a single packet can be
    # a millisecond late, so the claim is about the fastest and the median packet, as in
    # test_idle_rtt_is_within_1ms_of_the_setting; no packet may be early.
    for want, got in zip((10, 40), rtts, strict=True):
        assert len(got) == 5, rtts
        assert want <= got[0] < want + 1, rtts
        assert got[len(got) // 2] < want + 1, rtts


@needs_root
def test_loss_changes_while_the_path_runs():
    # Set up with 20 % loss, then changed to 2 %: what iperf3 sees is the new rate.
    spec = wan.WanSpec(rate_mbit=100, rtt_ms=10, loss=0.2, delay="delay-line")
    with wan.emulated_wan(spec, prefix="xwt") as w:
        w.set_loss(0.02)
        end = _iperf3(w, streams=4, seconds=3)
        share = end["sum_sent"]["retransmits"] / (end["sum_sent"]["bytes"] / MSS)
        w.set_loss(0)
        chain = subprocess.run(
            ["ip", "netns", "exec", w.router, "nft", "list", "chain", "ip", w.tag, "loss"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    assert 0.012 <= share <= 0.04, share
    assert "numgen" not in chain and "drop" not in chain, chain
    with pytest.raises(ValueError):
        w.set_loss(1.5)


@needs_root
def test_the_rtt_schedule_restarts_when_the_transfer_starts():
    spec = wan.WanSpec(
        rate_mbit=100, rtt_ms=10, delay="delay-line", rtt_schedule=((0, 10), (2, 40))
    )

    def fastest(w: wan.Wan) -> float:
        argv = ["ping", "-n", "-c", "3", "-i", "0.05", wan.RECEIVER_ADDR]
        out = subprocess.run(w.sender_cmd(0, argv), capture_output=True, text=True).stdout
        return min(float(m) for m in re.findall(r"time=([\d.]+) ms", out))

    with wan.emulated_wan(spec, prefix="xwt") as w:
        time.sleep(2.5)
        late = fastest(w)
        w.restart_rtt_schedule()
        again = fastest(w)
        time.sleep(2.5)
        after = fastest(w)
    assert 40 <= late < 41 and 10 <= again < 11 and 40 <= after < 41, (late, again, after)


def test_the_hosts_busy_time_counts_what_a_busy_loop_spends_and_guest_time_once():
    start = time.process_time()
    before = wan_commands.host_busy_seconds()
    while time.process_time() - start < 0.3:
        pass
    # Clock ticks of 10 ms: the loop's 0.3 s shows, whatever else ran meanwhile.
    assert wan_commands.host_busy_seconds() - before >= 0.25
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is in user.
    line = "cpu  100 0 50 800 50 0 0 0 30 0"
    assert wan_commands._ticks(line) == (1000, 850)
    assert wan_commands.busy_share(line, "cpu  200 0 50 850 50 0 0 0 30 0") == pytest.approx(2 / 3)
