"""Data-plane benchmark: `xfer --streams N` beside `iperf3 -P N`, memory-to-memory and
file-to-file (tmpfs), over loopback and over a veth pair between two namespaces.

Every figure is a ratio against iperf3 measured in the same invocation, runs interleaved and
repeated, medians reported, because absolute timings on a shared machine are noisy.

File-to-file is compared with three references: iperf3's own file mode (`-F` on both sides: the
client reads the file, the server writes what arrives into a file), iperf3 memory-to-memory (the
network's speed) and a local `cp` of the same file into the same tmpfs (the machine's ceiling).
iperf3 -F is the closest like-for-like tool, but not an exact one: it moves the file's size in
total, and with -P N every stream reads the file from its start and writes from offset 0, so
its receiver overwrites the first 1/N of the output N times instead of filling it (fewer fresh
pages to allocate), and nothing is checksummed; xfer writes every byte of a complete file once
and verifies it.

Virtual machines that hand freed memory back to their host (free page reporting) write into
memory that sat free for a few seconds at a fraction of normal speed: on the development VM a
2 GiB `cp` into tmpfs takes 0.2 s right after an equal-sized file was deleted and 4.6 s after a
6 s pause. So every file-writing run here, xfer's and cp's alike, starts right after the
previous run's output is deleted, and the tmpfs uses huge pages where the kernel offers them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from xfer_bench import supervise
from xfer_bench.netns import LOOPBACK, Topology, tear_down_on_signals, tmpfs, veth_pair

REPO = Path(__file__).resolve().parents[2]
DEFAULT_XFER = REPO / "target" / "release" / "xfer"


def harness_beside(xfer: Path) -> Path:
    """The harness's own tools (`xfer-harness`: the delay line, the checksum-rate probe), built
    beside `xfer` by the same `cargo build`."""
    harness = Path(xfer).with_name("xfer-harness")
    if not harness.exists():
        raise FileNotFoundError(
            f"{harness} is missing: build it with cargo build --release -p xfer-harness"
        )
    return harness


IPERF3_PORT = 5299

_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def write_payload(path: Path, size: int) -> None:
    """Writes `size` bytes (whole MiB, at least one) of incompressible data to `path`: one
    random MiB repeated, which no link or file system along the way can compress."""
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(max(1, size >> 20)):
            f.write(block)


def parse_size(text: str) -> int:
    """Bytes in a size such as `4GiB`, `512M` or `1000` (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a size like 4GiB or 512M")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


def iperf3_gbps(report: dict) -> float:
    """Received goodput in Gbit/s from an `iperf3 -J` report."""
    if "error" in report:
        raise RuntimeError(f"iperf3: {report['error']}")
    return report["end"]["sum_received"]["bits_per_second"] / 1e9


def xfer_summary(stdout: str) -> dict:
    """The summary line of `xfer send --json`."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            obj = json.loads(line)
            if obj.get("type") == "summary":
                return obj
    raise RuntimeError(f"no summary in xfer output: {stdout[-500:]!r}")


def xfer_summary_gbps(stdout: str) -> float:
    """Mean Gbit/s from the summary line of `xfer send --json`."""
    return float(xfer_summary(stdout)["gbit_per_s"])


def iperf3_report(
    topo: Topology,
    streams: int,
    seconds: float,
    files: tuple[Path, Path] | None = None,
    omit: float = 0,
    amount: int | None = None,
    cpu_logs: dict[str, Path] | None = None,
    prefixes: dict[str, Sequence[str]] | None = None,
) -> dict:
    """One `iperf3 -P streams -J` run; returns its report. Memory to memory for `seconds`
    (the first `omit` seconds left out) or for `amount` bytes (-n), or with `files` = (source,
    output) file to file (-F on both sides) for the source's size. With `cpu_logs` (paths for
    "sender" and "receiver") both sides run under the supervisor, which writes their CPU time
    there (`supervise.cpu_seconds`), and the server is let finish rather than killed; with
    `prefixes` too, each side runs behind its prefix (as `xfer_receiver`'s)."""
    server_cmd = ["iperf3", "-s", "-1", "-p", str(IPERF3_PORT)]
    cmd = ["iperf3", "-c", topo.receiver_addr, "-p", str(IPERF3_PORT), "-P", str(streams), "-J"]
    if files is not None:
        cmd += ["-F", str(files[0])]
        server_cmd += ["-F", str(files[1])]
    elif amount is not None:
        cmd += ["-n", str(amount)]
    else:
        cmd += ["-t", f"{seconds:g}", "-O", f"{omit:g}"]

    def launch(
        argv: list[str], on_side: Callable[[list[str]], list[str]], side: str, stdout: int
    ) -> subprocess.Popen:
        if cpu_logs is None:
            return subprocess.Popen(on_side(argv), stdout=stdout, stderr=subprocess.DEVNULL)
        argv = [*(prefixes or {}).get(side, ()), *argv]
        with cpu_logs[side].open("w") as err:
            return supervise.start(on_side(supervise.supervised(argv)), stdout=stdout, stderr=err)

    server = launch(server_cmd, topo.receiver_cmd, "receiver", subprocess.DEVNULL)
    try:
        for _ in range(50):
            client = launch(cmd, topo.sender_cmd, "sender", subprocess.PIPE)
            assert client.stdout is not None
            # Read to the end before stopping: a supervisor stops its process when its stdin
            # closes, as `communicate` would close it at once.
            report = json.loads(client.stdout.read() or "{}")
            client.wait()
            supervise.stop(client)
            if "Connection refused" in report.get("error", ""):
                time.sleep(0.1)
                continue
            if "error" in report:
                raise RuntimeError(f"iperf3: {report['error']}")
            if cpu_logs is not None:
                server.wait(timeout=30)
            return report
        raise RuntimeError("iperf3 server never came up")
    finally:
        if cpu_logs is None:
            server.kill()
            server.wait()
        else:
            supervise.stop(server)


def run_iperf3(
    topo: Topology, streams: int, seconds: float, files: tuple[Path, Path] | None = None
) -> float:
    """One `iperf3 -P streams` run (see `iperf3_report`); returns Gbit/s."""
    return iperf3_gbps(iperf3_report(topo, streams, seconds, files))


@dataclass
class XferReceiver:
    """A running `xfer recv` on the receiver side of a topology."""

    process: subprocess.Popen
    addr: str
    key: str
    root: Path


class Endpoints(Protocol):
    """Where commands run on the receiving side and how senders reach it: a `Topology` on
    this machine, or the hosts of a multi-host run."""

    @property
    def receiver_addr(self) -> str:
        """The receiver's address on the path under test."""
        ...

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on the receiver's side."""
        ...


@contextmanager
def xfer_receiver(
    xfer: Path | str,
    topo: Endpoints,
    root: Path | str,
    log: Path | None = None,
    port: int = 0,
    options: Sequence[str] = (),
    listen_host: str | None = None,
    prefix: Sequence[str] = (),
) -> Iterator[XferReceiver]:
    """Starts `xfer recv OPTIONS` writing under `root` on port `port` (0: any) of
    `listen_host` (default: the receiver's address on the path), its log to `log` if given,
    supervised so that it stops on exit wherever it runs, behind `prefix` (a command that runs
    it, such as `own_cpu.recorded`). The address it yields is where senders connect: the
    receiver's address on the path, with the port bound."""
    listen = f"{listen_host or topo.receiver_addr}:{port}"
    argv = [*prefix, str(xfer), "recv", "--listen", listen, "--root", str(root), *options]
    proc = supervise.start(
        topo.receiver_cmd(supervise.supervised(argv)),
        stdout=subprocess.PIPE,
        stderr=log.open("w") if log else subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        addr = proc.stdout.readline().decode().strip().removeprefix("listening on ")
        key = proc.stdout.readline().decode().strip().removeprefix("key ")
        if not addr or not key:
            raise RuntimeError(f"xfer recv did not start (exit {proc.poll()})")
        if listen_host:
            addr = f"{topo.receiver_addr}:{addr.rsplit(':', 1)[1]}"
        yield XferReceiver(proc, addr, key, Path(root))
    finally:
        supervise.stop(proc)


#: Writes standard input to the file named by the first argument, readable by its owner only
#: (how a sender's side gets the receiver's key: `xfer send` refuses keys on its command line).
KEY_FILE_WRITER = ["sh", "-c", 'umask 077 && cat > "$0"']


def write_key_file(rx: XferReceiver, path: Path) -> Path:
    """Writes the receiver's key to `path` on this machine (mode 600) for `--key-file`."""
    subprocess.run([*KEY_FILE_WRITER, str(path)], input=rx.key, text=True, check=True)
    return path


def run_xfer(
    topo: Topology, xfer: Path, rx: XferReceiver, streams: int, what: list[str], key_file: Path
) -> float:
    """One `xfer send WHAT --streams N --json` run with the key in `key_file`; returns mean
    Gbit/s. A `--transport` in `what` must be the one the summary reports."""
    cmd = [str(xfer), "send", *what[:-1], what[-1], "--key-file", str(key_file)]
    cmd += ["--streams", str(streams), "--json"]
    out = subprocess.run(topo.sender_cmd(cmd), capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"xfer send failed: {out.stderr.strip()}")
    summary = xfer_summary(out.stdout)
    if "--transport" in what:
        asked = what[what.index("--transport") + 1]
        if summary["transport"] != asked:
            raise RuntimeError(f"asked for {asked}, the transfer ran over {summary['transport']}")
    return float(summary["gbit_per_s"])


def unending_size(rate_mbit: float, seconds: float) -> int:
    """Bytes of generated data more than a `rate_mbit` path carries in `seconds`: a transfer of
    this size runs until it is stopped."""
    return max(int(rate_mbit * 1e6 / 8 * seconds * 2), 1 << 30)


def optimized_send_command(
    xfer: Path | str,
    rx: XferReceiver,
    what: Sequence[str],
    optimizer: str,
    mi_log: Path | str,
    key_file: Path | str,
    streams: int | None = None,
    stream_rate_cap_mbit: float | None = None,
    mi: str = "1s",
    seed: int = 0,
) -> list[str]:
    """`xfer send WHAT` (paths, or `--mem SIZE`) under `optimizer` seeded with `seed`,
    writing its MI log, quiet otherwise; the receiver's key is in `key_file` on the sender's
    side (see `write_key_file`)."""
    argv = [str(xfer), "send", *what, rx.addr, "--key-file", str(key_file)]
    argv += ["--optimizer", optimizer, "--mi", mi, "--mi-log", str(mi_log), "--quiet"]
    argv += ["--seed", str(seed)]
    if streams is not None:
        argv += ["--streams", str(streams)]
    if stream_rate_cap_mbit:
        argv += ["--stream-rate-cap", f"{stream_rate_cap_mbit:g}"]
    return argv


def read_mi_log(path: Path) -> list[dict]:
    """The records of an `xfer send --mi-log` file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def local_copy_gbps(source: Path, dest_dir: Path) -> float:
    """Gbit/s of copying `source` into a new file under `dest_dir` with cp (the copy is left
    there, so that the next file-writing run starts by freeing an equal amount of memory)."""
    target = dest_dir / "local-copy.bin"
    start = time.perf_counter()
    subprocess.run(["cp", str(source), str(target)], check=True)
    seconds = time.perf_counter() - start
    return target.stat().st_size * 8 / seconds / 1e9


def empty_dir(path: Path) -> None:
    """Removes everything under `path`, keeping `path`."""
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@dataclass
class Row:
    """Medians for one topology and stream count."""

    topology: str
    streams: int
    iperf3_gbps: float
    iperf3_file_gbps: float
    xfer_mem_gbps: float
    xfer_file_gbps: float
    copy_gbps: float

    @property
    def mem_ratio(self) -> float:
        """xfer memory-to-memory over iperf3."""
        return self.xfer_mem_gbps / self.iperf3_gbps

    @property
    def file_ratio(self) -> float:
        """xfer file-to-file over iperf3 file-to-file (-F), both on tmpfs."""
        return self.xfer_file_gbps / self.iperf3_file_gbps

    @property
    def file_vs_network(self) -> float:
        """xfer file-to-file (tmpfs) over iperf3 memory-to-memory."""
        return self.xfer_file_gbps / self.iperf3_gbps

    @property
    def file_vs_copy(self) -> float:
        """xfer file-to-file over a local cp into the same tmpfs."""
        return self.xfer_file_gbps / self.copy_gbps


def format_table(rows: Sequence[Row]) -> str:
    """The report as a Markdown table."""
    lines = [
        "| topology | N | iperf3 mem | xfer mem | **mem / iperf3** | iperf3 -F file | xfer file "
        "| **file / iperf3 -F** | file / iperf3 mem | local cp | file / cp |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.topology} | {r.streams} | {r.iperf3_gbps:.2f} | {r.xfer_mem_gbps:.2f} | "
            f"{r.mem_ratio:.2f} | {r.iperf3_file_gbps:.2f} | {r.xfer_file_gbps:.2f} | "
            f"{r.file_ratio:.2f} | {r.file_vs_network:.2f} | {r.copy_gbps:.2f} | "
            f"{r.file_vs_copy:.2f} |"
        )
    lines.append("")
    lines.append("Throughput in Gbit/s, medians; ratios in bold are the targets (0.95 and 0.90).")
    return "\n".join(lines)


def measure(
    topo: Topology,
    xfer: Path,
    streams: Sequence[int],
    reps: int,
    seconds: float,
    file_size: int,
    scratch: Path,
) -> list[Row]:
    """Interleaved, repeated runs of iperf3, xfer mem and xfer file for each stream count."""
    src = scratch / "src"
    dst = scratch / "dst"
    src.mkdir(exist_ok=True)
    dst.mkdir(exist_ok=True)
    source = src / "payload.bin"
    if not source.exists():
        write_payload(source, file_size)
    local_copy_gbps(source, dst)  # something of the same size to free before the first run
    rows = []
    with xfer_receiver(xfer, topo, dst) as rx:
        key = write_key_file(rx, scratch / "xfer.key")
        for n in streams:
            ref, ref_file, mem, fil, cp = [], [], [], [], []
            for _ in range(reps):
                ref.append(run_iperf3(topo, n, seconds))
                size = max(1 << 30, int(ref[-1] * 1e9 / 8 * seconds))
                mem.append(run_xfer(topo, xfer, rx, n, ["--mem", str(size), rx.addr], key))
                empty_dir(dst)
                fil.append(run_xfer(topo, xfer, rx, n, [str(source), rx.addr], key))
                empty_dir(dst)
                ref_file.append(run_iperf3(topo, n, seconds, (source, dst / "iperf3.bin")))
                empty_dir(dst)
                cp.append(local_copy_gbps(source, dst))
            empty_dir(dst)
            local_copy_gbps(source, dst)
            row = Row(
                topo.name,
                n,
                statistics.median(ref),
                statistics.median(ref_file),
                statistics.median(mem),
                statistics.median(fil),
                statistics.median(cp),
            )
            print(
                f"{topo.name} N={n}: iperf3 {row.iperf3_gbps:.2f}, xfer mem {row.xfer_mem_gbps:.2f}"
                f" ({row.mem_ratio:.2f}x); iperf3 -F {row.iperf3_file_gbps:.2f}, xfer file"
                f" {row.xfer_file_gbps:.2f} ({row.file_ratio:.2f}x; {row.file_vs_copy:.2f}x of"
                " local cp)",
                file=sys.stderr,
            )
            rows.append(row)
    return rows


@contextmanager
def topology(name: str) -> Iterator[Topology]:
    """The named topology, set up for the body and removed after it."""
    if name == "veth":
        with veth_pair() as topo:
            yield topo
    else:
        yield LOOPBACK


def print_report(command: str, table: str, rows: Sequence[object], json_path: Path | None) -> None:
    """Prints the command that reproduces a benchmark and its table, and writes the rows (data
    classes) as JSON to `json_path` when given."""
    print(f"reproduce: {command.strip()}\n")
    print(table)
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2))


def add_common_options(p: argparse.ArgumentParser, other: str | None = None) -> None:
    """The options every benchmark of this kind has: the xfer binary and a JSON copy of the
    rows; with `other` (its help text), `--other` too, another build's binary run beside it."""
    p.add_argument("--xfer", type=Path, default=DEFAULT_XFER, help="the xfer binary")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    if other is not None:
        p.add_argument("--other", type=Path, help=other)


def check_runnable(p: argparse.ArgumentParser, args: argparse.Namespace, root_for: str) -> None:
    """Ends with a usage error unless this runs as root (which it needs for `root_for`) and
    the xfer binary exists, and the other build's too when one is given."""
    if os.geteuid() != 0:
        p.error(f"needs root ({root_for})")
    if not args.xfer.exists():
        p.error(f"{args.xfer} does not exist: build it with cargo build --release")
    if getattr(args, "other", None) and not args.other.exists():
        p.error(f"{args.other} does not exist")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the benchmark and prints the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", default="1,4,8,16", help="stream counts, comma-separated")
    p.add_argument("--reps", type=int, default=3, help="repetitions per cell (median reported)")
    p.add_argument("--seconds", type=float, default=4.0, help="iperf3 run length")
    p.add_argument("--file-size", default="4GiB", help="size of the file-to-file payload")
    p.add_argument("--topologies", default="loopback,veth", help="loopback and/or veth")
    add_common_options(p)
    args = p.parse_args(argv)
    check_runnable(p, args, "tmpfs mounts and network namespaces")
    tear_down_on_signals()
    streams = [int(s) for s in args.streams.split(",")]
    names = args.topologies.split(",")
    if unknown := [n for n in names if n not in ("loopback", "veth")]:
        p.error(f"unknown topologies {unknown}: choose loopback and/or veth")
    file_size = parse_size(args.file_size)
    command = "scripts/bench-dataplane " + shlex.join(sys.argv[1:] if argv is None else argv)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="xfer-bench-") as tmp:
        tmpfs_size = f"{2 * file_size + (1 << 30)}"
        with tmpfs(os.path.join(tmp, "tmpfs"), tmpfs_size) as scratch:
            for name in names:
                with topology(name) as topo:
                    rows += measure(
                        topo, args.xfer, streams, args.reps, args.seconds, file_size, Path(scratch)
                    )
    print()
    print_report(command, format_table(rows), rows, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
