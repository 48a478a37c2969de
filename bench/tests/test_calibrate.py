import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xfer_bench import calibrate, wan

CALIBRATION = Path(__file__).resolve().parents[1] / "calibration"


def test_scenarios_map_to_emulated_paths():
    spec, cap = calibrate.scenario_path("paper-fig2")
    line_rate = 1000 * 1514 / 1448  # the scenario's capacity is goodput
    assert (spec.rate_mbit, spec.rtt_ms, cap) == (pytest.approx(line_rate), 1, 50)
    spec, cap = calibrate.scenario_path("cloudlab-1g")
    assert (spec.rtt_ms, spec.buffer_bytes(), spec.loss, cap) == (20, 2048 << 10, 1e-5, None)
    with pytest.raises(ValueError, match="background flows"):
        calibrate.scenario_path("background-arrives")
    with pytest.raises(ValueError, match="background flows"):
        calibrate.scenario_path("background-leaves")
    with pytest.raises(ValueError, match="changes during the run"):
        calibrate.scenario_path("capacity-halves-doubles")


def test_steady_mean_leaves_out_the_start():
    records = [{"time": t, "throughput": 1e6 * t} for t in range(1, 7)]
    assert calibrate.steady_mean(records, 3.5) == pytest.approx(5)
    assert calibrate.steady_mean(records, 10) == 0
    assert calibrate.Point(4, 100, 110).gap == pytest.approx(0.1)


def test_the_simulator_side_of_the_sweep():
    xfer = calibrate.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    mbit, loss = calibrate.simulate(xfer, "paper-fig2", 10, 10, 3)
    assert mbit == pytest.approx(500, rel=0.05) and loss < 1e-4
    # One stream at 280 Mbit/s and 1e-5 loss loses a segment every 4 s: 10 take 41 s.
    assert calibrate.seconds_for_losses(280, 1e-5, 1) == pytest.approx(41.4, rel=0.01)
    assert calibrate.seconds_for_losses(500, 0.0, 10) == 0


def test_scenario_files_map_like_shipped_names():
    spec, cap = calibrate.scenario_path(str(CALIBRATION / "long-deep.toml"))
    assert (spec.rtt_ms, spec.buffer_bytes(), cap) == (100, 2441 << 10, None)
    assert calibrate.scenario_file("cloudlab-1g") == calibrate.SCENARIOS / "cloudlab-1g.toml"


def test_a_schedule_is_split_into_its_steps_and_compared_step_by_step():
    assert calibrate.schedule_steps("0s:1,15s:6,40s:1", 65) == [
        (0, 1, 15), (15, 6, 40), (40, 1, 65)
    ]  # fmt: skip
    assert calibrate.schedule_steps("0s:2, 30:4", 20) == [(0, 2, 20)]
    with pytest.raises(ValueError):
        calibrate.schedule_steps("0s:one", 10)
    emulated = [100.0] * 4 + [50.0, 150.0, 200.0, 200.0]
    simulated = [100.0] * 4 + [200.0] * 4
    steps = calibrate.compare_steps(emulated, simulated, "0s:1,4s:6", window=2)
    assert [(s.start, s.streams) for s in steps] == [(0, 1), (4, 6)]
    assert steps[0].gaps == (0, 0)
    assert steps[1].emulated_first == 100 and steps[1].emulated_all == 150
    assert steps[1].gaps == (pytest.approx(1.0), pytest.approx(1 / 3))
    # The path changing at 6 s splits the second step there.
    split = calibrate.compare_steps(emulated, simulated, "0s:1,4s:6", 2, path_changes=[6.0])
    assert [(s.start, s.streams) for s in split] == [(0, 1), (4, 6), (6, 6)]
    assert split[1].emulated_all == 100 and split[2].emulated_all == 200


def test_a_changing_path_becomes_a_timetable_for_the_emulator():
    xfer = calibrate.DEFAULT_XFER
    timetable = calibrate.path_timetable(xfer, "capacity-halves-doubles", 200)
    mbit = 1514 / 1448  # line rate per Mbit/s of goodput
    assert [(p.time, p.rate_mbit / mbit, p.rtt_ms, p.loss) for p in timetable] == [
        (0, pytest.approx(1000), 20, 0), (70, pytest.approx(500), 20, 0),
        (140, pytest.approx(1000), 20, 0),
    ]  # fmt: skip
    spec, _ = calibrate.scenario_path("capacity-halves-doubles", changing=True)
    assert calibrate.with_timetable(spec, timetable) == spec, "the RTT holds: no delay line"
    rtts = calibrate.path_timetable(xfer, "rtt-rises-falls", 200)
    spec = calibrate.with_timetable(calibrate.scenario_path("rtt-rises-falls", True)[0], rtts)
    assert spec.delay == "delay-line" and spec.rtt_schedule == ((0, 10), (70, 80), (140, 10))
    loss = calibrate.path_timetable(xfer, "loss-comes-and-goes", 200)
    assert [(p.time, p.loss) for p in loss] == [(0, 0), (50, 1e-4), (100, 0), (150, 1e-4)]


def test_runs_are_binned_by_the_second_their_intervals_end_in():
    runs = [
        [{"time": 1.02, "throughput": 10e6}, {"time": 2.02, "throughput": 30e6}],
        [{"time": 0.98, "throughput": 20e6}, {"time": 2.5, "throughput": 50e6}],
    ]
    assert calibrate.per_interval(runs, 3) == [20, 10, 40]


def test_the_simulator_follows_a_schedule():
    xfer = calibrate.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    rows = calibrate.simulated_intervals(xfer, "paper-fig2", "schedule:0s:4,5s:10", 10)
    assert [r["streams"] for r in rows] == [4] * 5 + [10] * 5
    # 50 Mbit/s streams at 1 ms ramp up within the interval they open in.
    assert rows[3]["throughput"] == pytest.approx(200e6, rel=0.1)
    assert rows[6]["throughput"] == pytest.approx(500e6, rel=0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_a_stopped_calibration_leaves_nothing():
    cmd = [sys.executable, "-m", "xfer_bench.calibrate", "--scenarios", "paper-fig2",
           "--streams", "2", "--seconds", "60", "--repetitions", "1"]  # fmt: skip
    assert not _senders_running(), "a sender of an earlier run is still running"
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not _senders_running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _senders_running(), "the sweep never started"
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=20) == 143
    assert wan.leftovers() == [] and not _senders_running()
    assert "delay-line" not in subprocess.run(["pgrep", "-af", "xfer"], capture_output=True,
                                              text=True).stdout  # fmt: skip


def _senders_running() -> bool:
    out = subprocess.run(["pgrep", "-f", "xfer send --mem"], capture_output=True, text=True)
    return bool(out.stdout.strip())
