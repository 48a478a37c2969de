"""Per-stream rate caps for tools that have no option for them (globus-url-copy): the
LD_PRELOAD library of `bench/preload/pace_streams.c`, compiled with the sending host's C
compiler when a run needs it, sets SO_MAX_PACING_RATE on every TCP socket the tool opens,
as xfer's --stream-rate-cap and iperf3's --fq-rate do."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "preload" / "pace_streams.c"
LIBRARY = "libpace_streams.so"


def build_command(output: str) -> list[str]:
    """Compiles the library's source, read from stdin, into `output`."""
    return ["cc", "-O2", "-shared", "-fPIC", "-o", output, "-x", "c", "-", "-ldl"]


def capped(argv: Sequence[str], mbit: float, library: str) -> list[str]:
    """`argv` with every TCP socket it opens paced to `mbit` Mbit/s."""
    return ["env", f"LD_PRELOAD={library}", f"XFER_PACE_MBIT={mbit:g}", *argv]
