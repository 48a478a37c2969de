"""A process's CPU time split into what it ran itself and the interrupt work the kernel charged
to it, from `perf` sampling (Debian's linux-perf).

A process's user + system time includes every softirq that ran while it was on a CPU:
receive processing, acknowledgements, and on the emulated WAN the htb qdisc and the delay
line's TUN device, whichever process they interrupted. Two tools on the same path can thus be
charged very different times for the same work (on the 600 Mbit/s, 30 ms path iperf3's client
was charged 1.4-2.1 s per GiB with one stream in runs a minute apart, xfer's sender 1.1 s, and
with four streams the order reversed). Sampling the process's CPU clock with call chains
tells the two apart: a sample whose kernel stack passes through the softirq handler is
interrupt work, any other is the process's own, its system calls included.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

#: CPU time between two samples: one per millisecond the process runs.
PERIOD_NS = 1_000_000

#: Where the kernel runs pending softirqs, on return from an interrupt or when a task enables
#: them again (`__do_softirq` before Linux 6.10).
SOFTIRQ_FRAMES = frozenset({"handle_softirqs", "__do_softirq"})

#: Frames of every system call: without them among the samples, the kernel's symbols were not
#: readable and the split would count everything as the process's own.
SYSCALL_FRAMES = frozenset({"do_syscall_64", "entry_SYSCALL_64"})

#: Runs `perf record` on a command, turning TERM (how a supervisor stops it) into the INT on
#: which perf stops its workload, waits for it and writes its samples; a TERM would kill perf
#: and lose them. `$0` is the data file, the rest the command.
_RECORD = (
    f'perf record -q -e cpu-clock -c {PERIOD_NS} -g -o "$0" -- "$@" & p=$!; '
    'trap "kill -INT $p" TERM INT; wait $p; wait $p'
)


def recorded(data: Path) -> list[str]:
    """The prefix of a command line that samples the command into `data` (for `own_seconds`)."""
    return ["sh", "-c", _RECORD, str(data)]


def own_seconds(data: Path) -> float:
    """The CPU seconds a process recorded under `recorded` ran in its own context: its code
    and its system calls, without the softirqs that ran while it was on a CPU."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return own_seconds_in(script, str(data))


def own_seconds_in(script: str, source: str) -> float:
    """`own_seconds` of the output of `perf script -F ip,sym` (of `source`, for the error)."""
    samples = own = 0
    symbols_seen = False
    for sample in script.split("\n\n"):
        # A line per frame: the address, then the symbol.
        frames = {line.split(None, 1)[-1] for line in sample.strip().splitlines()}
        if not frames:
            continue
        samples += 1
        symbols_seen = symbols_seen or bool(frames & SYSCALL_FRAMES)
        own += not frames & SOFTIRQ_FRAMES
    if samples and not symbols_seen:
        raise RuntimeError(f"{source}: no kernel symbols in the samples (is kptr_restrict set?)")
    return own * PERIOD_NS / 1e9
