"""Every process a run starts (senders, receivers, baseline servers), on this machine, in a
namespace or on a remote host over ssh, runs under one small POSIX shell supervisor that

- stops it (SIGTERM) when the supervisor's stdin closes: the harness stopped it, exited or
  crashed, or the ssh connection dropped, so nothing is left running on any host;
- passes on TERM, INT and HUP sent to the supervisor;
- prints the CPU time the process used (user + system, from the shell's `times`) on stderr
  after it ends, which works the same on a remote host as here.
"""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO

#: Marks the supervisor's CPU report on stderr.
CPU_MARKER = "xfer-bench-cpu"

_SCRIPT = f"""
exec 3<&0
"$@" </dev/null &
p=$!
trap 'kill -TERM $p 2>/dev/null' TERM INT HUP
{{ cat <&3 >/dev/null; kill -TERM $p; }} >/dev/null 2>&1 &
w=$!
while :; do wait $p; s=$?; kill -0 $p 2>/dev/null || break; done
kill $w 2>/dev/null
echo {CPU_MARKER} >&2
times >&2
exit $s
"""

_TIMES = re.compile(r"(\d+)m(\d+(?:\.\d+)?)s")


def supervised(argv: Sequence[str]) -> list[str]:
    """`argv` under the supervisor (a command line for this machine or a namespace)."""
    return ["sh", "-c", _SCRIPT, "xfer-bench", *argv]


def start(
    argv: Sequence[str], stdout: IO | int | None, stderr: IO | int | None
) -> subprocess.Popen:
    """Starts a supervised command line, holding its stdin open until `stop`."""
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Stops a supervised process (if still running) and waits for it.

    Closing its stdin first lets the supervisor stop the process and report its CPU time even
    through ssh (a signal would only stop the local ssh client); SIGTERM follows after
    `timeout` seconds, SIGKILL after as many again."""
    if proc.stdin:
        try:
            proc.stdin.close()
        except OSError:
            pass
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and proc.poll() is None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue


def cpu_seconds(stderr_log: Path) -> float | None:
    """The CPU seconds the supervisor reported in a stderr log, or None if it did not."""
    text = stderr_log.read_text(errors="replace")
    at = text.rfind(CPU_MARKER)
    if at < 0:
        return None
    # `times` prints the shell's own user and system time, then its children's.
    found = _TIMES.findall(text[at:])
    if len(found) < 4:
        return None
    return sum(int(m) * 60 + float(s) for m, s in found[2:4])
