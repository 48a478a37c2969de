"""Runs an experiment on the emulated WAN or between real hosts: for every variant and
repetition, a fresh path (or the hosts' scratch directories), the transfers started and stopped
on time (xfer with its optimiser writing its MI log, iperf3 reporting every second,
globus-url-copy reporting its progress), capacity changes applied, and each transfer's samples
and CPU time collected."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from xfer_bench import pacing, supervise
from xfer_bench.dataplane import (
    KEY_FILE_WRITER,
    XferReceiver,
    optimized_send_command,
    read_mi_log,
    unending_size,
    xfer_receiver,
)
from xfer_bench.experiment import Experiment, Transfer, Variant
from xfer_bench.hosts import Host, Hosts, check, connected
from xfer_bench.metrics import Sample, TransferResult, Window, link_utilisation, windows
from xfer_bench.wan import RECEIVER_ADDR, Wan, emulated_wan
from xfer_bench.wan_commands import cpu_busy

IPERF3_BASE_PORT = 5320
GRIDFTP_BASE_PORT = 2820
MSS = 1448
#: A `globus-url-copy -vb` progress report: bytes so far (printed every few seconds).
GRIDFTP_PROGRESS = re.compile(rb"(\d+) bytes\s+[\d.]+ MB/sec avg")


@dataclass
class RunResult:
    """One repetition of one variant."""

    variant: str
    repetition: int
    transfers: list[TransferResult]
    windows: list[Window]
    utilisation: float
    #: Largest share of CPUs busy on a machine of the run just before it (something else
    #: running skews the figures).
    busy_before: float
    log_dir: Path


class Network(Protocol):
    """What a run needs of the path it runs on: the emulated WAN or a set of real hosts."""

    @property
    def receiver_addr(self) -> str:
        """Where the senders reach the receiver."""
        ...

    @property
    def receiver_root(self) -> str:
        """The directory `xfer recv` writes under, on the receiver's side."""
        ...

    #: Whether the receiver's side runs commands as root.
    receiver_is_root: bool
    #: `startport,endport` for GridFTP's data connections, or None for any.
    gridftp_port_range: str | None

    def xfer(self, index: int | None) -> str:
        """The xfer binary of sender `index`, or of the receiver (None)."""
        ...

    def sender_cmd(self, index: int, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on sender `index`'s side."""
        ...

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """The local command line that runs `argv` on the receiver's side."""
        ...

    def sender_path(self, index: int, name: str) -> str:
        """A file called `name` in sender `index`'s scratch directory (logs, helpers)."""
        ...

    def sender_run(self, index: int, argv: Sequence[str], stdin: str = "") -> str:
        """Runs a short command on sender `index`'s side and returns its stdout."""
        ...

    def collect(self, index: int, path: str, local: Path) -> None:
        """Brings a log that sender `index` wrote at `path` to `local`."""
        ...

    def set_rate(self, rate_mbit: float) -> None:
        """Changes the bottleneck's rate now."""
        ...

    def set_loss(self, loss: float) -> None:
        """Changes the path's random loss now."""
        ...

    def busy(self) -> float:
        """The largest share of CPUs busy on any machine of the run, just now (something else
        running skews the figures)."""
        ...


@dataclass
class EmulatedNetwork:
    """The emulated WAN as a `Network`: namespaces share this machine's files, so senders
    and the receiver get directories of one local scratch directory."""

    wan: Wan
    xfer_path: Path
    scratch: Path
    receiver_addr: str = RECEIVER_ADDR
    receiver_is_root: bool = True
    gridftp_port_range: str | None = None

    def xfer(self, index: int | None) -> str:
        """The one xfer binary every namespace runs."""
        return str(self.xfer_path)

    def sender_cmd(self, index: int, argv: Sequence[str]) -> list[str]:
        """`argv` in sender `index`'s namespace."""
        return self.wan.sender_cmd(index, argv)

    def receiver_cmd(self, argv: Sequence[str]) -> list[str]:
        """`argv` in the receiver's namespace."""
        return self.wan.receiver_cmd(argv)

    @property
    def receiver_root(self) -> str:
        """`recv` in the scratch directory."""
        return str(self.scratch / "recv")

    def sender_path(self, index: int, name: str) -> str:
        """A file in `send-N` of the scratch directory."""
        return str(self.scratch / f"send-{index + 1}" / name)

    def sender_run(self, index: int, argv: Sequence[str], stdin: str = "") -> str:
        """Runs a short command on this machine."""
        return Host(ssh=None, xfer=str(self.xfer_path)).run(argv, stdin)

    def collect(self, index: int, path: str, local: Path) -> None:
        """Copies the file into the log directory."""
        shutil.copyfile(path, local)

    def set_rate(self, rate_mbit: float) -> None:
        """The bottleneck's htb rate."""
        self.wan.set_rate(rate_mbit)

    def set_loss(self, loss: float) -> None:
        """The nftables rule dropping data segments at random."""
        self.wan.set_loss(loss)

    def busy(self) -> float:
        """Share of this machine's CPUs busy just now."""
        return cpu_busy(0.5)


def _mi_log_name(t: Transfer) -> str:
    return f"T{t.index + 1}.mi.jsonl"


def _pacing_library(net: Network, index: int) -> str:
    """Builds the per-stream pacing library on sender `index`'s side; returns its path."""
    path = net.sender_path(index, pacing.LIBRARY)
    net.sender_run(index, pacing.build_command(path), pacing.SOURCE.read_text())
    return path


#: Shell scripts that generate a finite workload on a sender: "$1" path, "$2" bytes per file,
#: "$3" files (split makes exactly that many files of that size out of one random stream).
_GENERATE = {
    "file": 'head -c "$2" /dev/urandom > "$1"',
    "tree": 'mkdir "$1" && cd "$1" && head -c "$(($2 * $3))" /dev/urandom | split -a 6 -b "$2" - f',
}


def _generate(net: Network, t: Transfer) -> str:
    """Generates transfer `t`'s file or tree of random data on its sender; returns its path."""
    w = t.workload
    path = net.sender_path(t.index, f"T{t.index + 1}-{w.kind}")
    net.sender_run(t.index, ["sh", "-c", _GENERATE[w.kind], "sh", path, str(w.size), str(w.count)])
    return path


@dataclass(frozen=True)
class _Setup:
    """What a run prepared before its clock started."""

    net: Network
    receiver: XferReceiver | None
    #: The bottleneck's rate in Mbit/s (sizes memory-to-memory transfers, link use).
    rate_mbit: float
    #: xfer's --seed for this repetition.
    seed: int
    #: Generated data of each transfer with a finite workload, by transfer index.
    sources: dict[int, str]
    #: The pacing library of each capped GridFTP transfer, by transfer index.
    pacing_libraries: dict[int, str]
    #: Where each xfer transfer's side holds the receiver's key, by transfer index.
    key_files: dict[int, str]


def _command(t: Transfer, exp: Experiment, setup: _Setup) -> list[str]:
    net = setup.net
    seconds = t.stop_s - t.start_s
    source = setup.sources.get(t.index)
    # More than the path can carry in the time, so the transfer runs until it is stopped.
    size = unending_size(setup.rate_mbit, seconds)
    if t.tool == "iperf3":
        port = IPERF3_BASE_PORT + t.index
        argv = ["iperf3", "-c", net.receiver_addr, "-p", str(port), "-P", str(t.streams)]
        if t.stream_rate_cap_mbit:
            # SO_MAX_PACING_RATE per stream, as xfer's --stream-rate-cap sets it.
            argv += ["--fq-rate", f"{t.stream_rate_cap_mbit:g}M"]
        # A file is sent once (iperf3 -F ends at its end); memory to memory for the time.
        argv += ["-F", source] if source else ["-t", f"{seconds:g}"]
        return argv + ["-i", "1", "-J"]
    if t.tool == "gridftp":
        port = GRIDFTP_BASE_PORT + t.index
        if source:
            name = Path(source).name
            what = [
                f"file://{source}",
                f"ftp://{net.receiver_addr}:{port}{net.receiver_root}/{name}",
            ]
        else:
            # /dev/zero read for `size` bytes, written to the server's /dev/null.
            what = ["-off", "0", "-len", str(size), "file:///dev/zero",
                    f"ftp://{net.receiver_addr}:{port}/dev/null"]  # fmt: skip
        argv = ["globus-url-copy", "-vb", "-fast", "-p", str(t.streams), *what]
        if t.stream_rate_cap_mbit:
            argv = pacing.capped(argv, t.stream_rate_cap_mbit, setup.pacing_libraries[t.index])
        return argv
    assert setup.receiver is not None and t.optimizer is not None
    log = net.sender_path(t.index, _mi_log_name(t))
    return optimized_send_command(
        net.xfer(t.index), setup.receiver, [source] if source else ["--mem", str(size)],
        t.optimizer, log, setup.key_files[t.index], t.streams, t.stream_rate_cap_mbit, exp.mi,
        setup.seed,
    )  # fmt: skip


def _key_file(net: Network, index: int, receiver: XferReceiver) -> str:
    """Writes the receiver's key on sender `index`'s side (mode 600) and returns the path."""
    path = net.sender_path(index, "xfer.key")
    net.sender_run(index, [*KEY_FILE_WRITER, path], stdin=receiver.key)
    return path


def _server_command(t: Transfer, net: Network) -> list[str] | None:
    """The receiving side a baseline tool needs, if any."""
    if t.tool == "iperf3":
        return ["iperf3", "-s", "-1", "-p", str(IPERF3_BASE_PORT + t.index)]
    if t.tool == "gridftp":
        # Anonymous access; as root the server must be told which user that is.
        options = ["-anonymous-user", "root", "-allow-root"] if net.receiver_is_root else []
        if net.gridftp_port_range:
            options += ["-port-range", net.gridftp_port_range]
        return ["globus-gridftp-server", "-aa", *options, "-p", str(GRIDFTP_BASE_PORT + t.index),
                "-control-interface", net.receiver_addr, "-data-interface", net.receiver_addr,
                "-d", "error"]  # fmt: skip
    return None


def _timestamp_progress(stream: IO[bytes], start: float, out: Path) -> None:
    """Writes each progress report of globus-url-copy with the second it arrived."""
    with out.open("w") as f:
        pending = b""
        while chunk := stream.read1(4096):  # type: ignore[attr-defined]
            pending += chunk
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                if m := GRIDFTP_PROGRESS.search(line):
                    f.write(f"{time.monotonic() - start:.3f} {int(m.group(1))}\n")
                    f.flush()


def _samples(t: Transfer, launched: float, logs: Path) -> list[Sample]:
    """The transfer's samples, timed from the start of the run."""
    if t.tool == "gridftp":
        # Lines of "seconds-since-run-start bytes" from _timestamp_progress.
        points = [(launched, 0)]
        for line in (logs / f"T{t.index + 1}.progress").read_text().splitlines():
            at, total = line.split()
            points.append((float(at), int(total)))
        if len(points) < 2:
            raise RuntimeError("globus-url-copy reported no progress")
        # One sample per second at the mean rate of the report interval it falls in, so
        # that seconds between reports count in totals and fairness windows.
        out = []
        for (t0, b0), (t1, b1) in zip(points, points[1:], strict=False):
            if t1 > t0:
                mbit = (b1 - b0) * 8 / (t1 - t0) / 1e6
                ends = [t0 + k for k in range(1, int(t1 - t0) + 1)]
                if not ends or ends[-1] < t1:
                    ends.append(t1)
                out += [Sample(t=e, mbit=mbit, streams=t.streams, loss=None) for e in ends]
        return out
    if t.tool == "iperf3":
        text = (logs / f"T{t.index + 1}.stdout").read_text()
        report = json.loads(text or "{}")
        if "error" in report or "intervals" not in report:
            raise RuntimeError(f"iperf3: {report.get('error', 'no report')}")
        out = []
        for interval in report["intervals"]:
            s = interval["sum"]
            segments = max(s["bytes"] / MSS, 1.0)
            out.append(
                Sample(
                    t=launched + s["end"],
                    mbit=s["bits_per_second"] / 1e6,
                    streams=t.streams,
                    loss=s.get("retransmits", 0) / segments,
                )
            )
        return out
    records = read_mi_log(logs / f"T{t.index + 1}.mi.jsonl")
    return [
        Sample(
            t=launched + r["time"],
            mbit=r["throughput"] / 1e6,
            streams=r["streams"],
            loss=r["loss"],
        )
        for r in records
    ]


def bottleneck_mbit(exp: Experiment, hosts: Hosts | None) -> float:
    """The bottleneck's rate: the hosts file's for real hosts, when it gives one; else the
    experiment's path's."""
    return hosts.rate_mbit if hosts and hosts.rate_mbit else exp.path.rate_mbit


@contextmanager
def _network(exp: Experiment, xfer: Path, hosts: Hosts | None) -> Iterator[Network]:
    """A fresh emulated path, or the hosts with fresh scratch directories."""
    if hosts is not None:
        with connected(hosts) as net:
            yield net
        return
    with (
        tempfile.TemporaryDirectory(prefix="xfer-bench-run-") as root,
        emulated_wan(exp.path, xfer) as wan,
    ):
        scratch = Path(root)
        for name in ["recv", *(f"send-{i + 1}" for i in range(exp.path.senders))]:
            (scratch / name).mkdir()
        yield EmulatedNetwork(wan, xfer, scratch)


def run_variant(
    exp: Experiment,
    variant: Variant,
    repetition: int,
    out: Path,
    xfer: Path,
    hosts: Hosts | None = None,
) -> RunResult:
    """One repetition of `variant` on a fresh emulated path, or between `hosts`; logs go
    under `out`."""
    logs = out / f"{variant.name}-r{repetition + 1}"
    logs.mkdir(parents=True, exist_ok=True)
    rate = bottleneck_mbit(exp, hosts)
    results = {t.index: TransferResult(t.label, t.start_s) for t in variant.transfers}
    with _network(exp, xfer, hosts) as net, ExitStack() as stack:
        busy = net.busy()
        receiver = None
        if any(t.tool == "xfer" for t in variant.transfers):
            port = hosts.receiver_port if hosts else 0
            receiver = stack.enter_context(
                xfer_receiver(net.xfer(None), net, net.receiver_root, logs / "receiver.log", port)
            )
        for t in variant.transfers:
            argv = _server_command(t, net)
            if argv:
                log = (logs / f"T{t.index + 1}.server.log").open("w")
                proc = supervise.start(net.receiver_cmd(supervise.supervised(argv)), log, log)
                stack.callback(supervise.stop, proc)
        setup = _Setup(
            net=net,
            receiver=receiver,
            rate_mbit=rate,
            seed=exp.seed + repetition,
            sources={t.index: _generate(net, t) for t in variant.transfers if t.workload.count},
            pacing_libraries={
                t.index: _pacing_library(net, t.index)
                for t in variant.transfers
                if t.tool == "gridftp" and t.stream_rate_cap_mbit
            },
            key_files={
                t.index: _key_file(net, t.index, receiver)
                for t in variant.transfers
                if t.tool == "xfer" and receiver
            },
        )
        time.sleep(0.3)
        _timeline(exp, variant, repetition, setup, logs, results)
    transfers = [results[t.index] for t in variant.transfers]
    return RunResult(
        variant=variant.name,
        repetition=repetition,
        transfers=transfers,
        windows=windows(transfers),
        utilisation=link_utilisation(transfers, rate),
        busy_before=busy,
        log_dir=logs,
    )


def _timeline(
    exp: Experiment,
    variant: Variant,
    repetition: int,
    setup: _Setup,
    logs: Path,
    results: dict[int, TransferResult],
) -> None:
    """Starts and stops the transfers and applies capacity and loss changes on time."""
    running: dict[int, tuple[subprocess.Popen[bytes], float]] = {}
    done: set[int] = set()
    rates = list(exp.rate_schedule)
    losses = list(exp.loss_schedule)
    start = time.monotonic()
    next_progress = 0.0
    try:
        while True:
            now = time.monotonic() - start
            while rates and rates[0][0] <= now:
                setup.net.set_rate(rates.pop(0)[1])
            while losses and losses[0][0] <= now:
                setup.net.set_loss(losses.pop(0)[1])
            for t in variant.transfers:
                i = t.index
                if i not in running and i not in done and t.start_s <= now:
                    argv = setup.net.sender_cmd(i, supervise.supervised(_command(t, exp, setup)))
                    err = (logs / f"T{i + 1}.stderr").open("w")
                    if t.tool == "gridftp":
                        proc = supervise.start(argv, subprocess.PIPE, err)
                        reader = threading.Thread(
                            target=_timestamp_progress,
                            args=(proc.stdout, start, logs / f"T{i + 1}.progress"),
                            daemon=True,
                        )
                        reader.start()
                    else:
                        out = (logs / f"T{i + 1}.stdout").open("w")
                        proc = supervise.start(argv, out, err)
                    running[i] = (proc, now)
                elif i in running:
                    proc, launched = running[i]
                    # iperf3 stops by itself after -t; give it a moment to print its report.
                    grace = 3.0 if t.tool == "iperf3" else 0.0
                    if proc.poll() is not None or now >= t.stop_s + grace:
                        _finish(t, proc, launched, now, setup.net, logs, results[i])
                        del running[i]
                        done.add(i)
            if len(done) == len(variant.transfers) or now > exp.duration_s + 5:
                break
            if now >= next_progress:
                _progress(exp, variant, repetition, now, sorted(running))
                next_progress += 1.0 if sys.stderr.isatty() else 10.0
            time.sleep(0.2)
    finally:
        now = time.monotonic() - start
        for i, (proc, launched) in running.items():
            _finish(variant.transfers[i], proc, launched, now, setup.net, logs, results[i])
        if sys.stderr.isatty():
            print(file=sys.stderr)


def _progress(
    exp: Experiment, variant: Variant, repetition: int, now: float, running: list[int]
) -> None:
    """One progress line: rewritten in place on a terminal, a line every 10 s otherwise."""
    label = f"[{exp.name} {variant.name} {repetition + 1}/{exp.repetitions}]"
    active = " ".join(f"T{i + 1}" for i in running) or "-"
    text = f"{label} {now:5.0f}/{exp.duration_s:g} s  sending: {active}"
    if sys.stderr.isatty():
        print(f"\r{text}   ", end="", file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


def _finish(
    t: Transfer,
    proc: subprocess.Popen[bytes],
    launched: float,
    now: float,
    net: Network,
    logs: Path,
    result: TransferResult,
) -> None:
    """Stops a transfer (if still running) that started `launched` seconds into the run, at
    `now`, then records how it ended, its CPU time and its samples."""
    ended = proc.poll() is not None
    supervise.stop(proc)
    stderr = logs / f"T{t.index + 1}.stderr"
    result.cpu_s = supervise.cpu_seconds(stderr)
    failed = ended and proc.returncode != 0
    problem = f"exited with status {proc.returncode}" if failed else None
    try:
        if t.tool == "xfer":
            # A failed transfer's log too: it shows what the transfer did until then.
            name = _mi_log_name(t)
            net.collect(t.index, net.sender_path(t.index, name), logs / name)
        if not failed:
            if ended and t.workload.count:
                result.completed_s = now - launched
            result.samples = _samples(t, launched, logs)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        problem = problem or str(e)
    if problem:
        err = stderr.read_text().split(supervise.CPU_MARKER)[0].strip()
        result.error = f"{problem}; {err[-300:]}" if err else problem


def run(
    exp: Experiment,
    out: Path,
    xfer: Path,
    variants: list[str] | None = None,
    hosts: Hosts | None = None,
) -> list[RunResult]:
    """Every repetition of every (selected) variant, interleaved by repetition, on the
    emulated WAN or between `hosts`."""
    chosen = [v for v in exp.variants if variants is None or v.name in variants]
    if variants and (missing := set(variants) - {v.name for v in chosen}):
        raise ValueError(f"no variants named {sorted(missing)} in {exp.name}")
    tools = {t.tool for v in chosen for t in v.transfers}
    if any(t.tool == "gridftp" and t.stream_rate_cap_mbit for v in chosen for t in v.transfers):
        tools.add("paced-gridftp")
    if hosts is not None:
        if exp.rate_schedule or exp.loss_schedule or exp.path.rtt_schedule:
            raise ValueError(
                "a real network cannot follow the experiment's rate, loss or RTT schedule; "
                "run it on the emulated WAN"
            )
        check(hosts, exp.path.senders, tools)
        print(
            "xfer-bench-run: between real hosts the network's own RTT, buffer and loss apply; "
            "the experiment's rtt_ms, buffer and loss are not emulated",
            file=sys.stderr,
        )
    else:
        if os.geteuid() != 0:
            raise RuntimeError("the emulated WAN needs root (network namespaces)")
        needed = {
            "iperf3": ["iperf3"],
            "gridftp": ["globus-url-copy", "globus-gridftp-server"],
            "paced-gridftp": ["cc"],
        }
        if missing := [b for tool in tools for b in needed.get(tool, []) if not shutil.which(b)]:
            raise RuntimeError(
                f"missing {', '.join(missing)}: install Debian's iperf3, globus-gass-copy-progs, "
                "globus-gridftp-server-progs and gcc (scripts/test does)"
            )
    return [
        run_variant(exp, v, rep, out, xfer, hosts) for rep in range(exp.repetitions) for v in chosen
    ]
