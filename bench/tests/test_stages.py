"""scripts/lib/stages.sh, which the test command runs its stages with: every stage reported
with its verdict and time, a failed stage stopping at its first failing command without
stopping the stages after it, and a closing count with the exit status it implies."""

import subprocess
from pathlib import Path

STAGES = Path(__file__).resolve().parents[2] / "scripts" / "lib" / "stages.sh"


def run(body: str) -> subprocess.CompletedProcess:
    script = f"set -euo pipefail\n. {STAGES}\n{body}\n"
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_every_stage_runs_and_the_verdict_counts_them():
    done = run(
        """
two_steps() { false; echo "after the failure"; }
stage "first" true
stage "second" two_steps
stage "third" bash -c 'exit 3'
stage "fourth" export LEAKED=1
echo "leaked=${LEAKED:-no}"
stages_verdict
echo "not reached"
"""
    )
    out = done.stdout
    assert done.returncode == 1, out
    assert "after the failure" not in out, "a stage stops at its first failing command"
    assert "=== stage: first: passed in 0m00s" in out
    assert "=== stage: second: FAILED (exit status 1)" in out
    assert "=== stage: third: FAILED (exit status 3)" in out
    assert "leaked=no" in out, "a stage's exports stay in it"
    assert "=== 2 passed, 2 failed" in out
    assert "not reached" not in out
    table = out.split("=== stages\n")[1].splitlines()
    assert [line.split()[0] for line in table[:4]] == ["first", "second", "third", "fourth"]
    assert table[1].endswith("FAILED")


def test_a_run_whose_stages_pass_exits_zero():
    done = run('stage "only" true\nstages_verdict\necho "after"')
    assert done.returncode == 0, done.stdout
    assert "=== 1 passed, 0 failed" in done.stdout
    assert "after" in done.stdout


def test_a_failed_setup_stage_ends_the_run_with_the_verdict():
    done = run('stage_setup "setup" false\necho "not reached"\nstages_verdict')
    assert done.returncode == 1
    assert "=== stage: setup: FAILED (exit status 1)" in done.stdout
    assert "=== 0 passed, 1 failed" in done.stdout
    assert "not reached" not in done.stdout
