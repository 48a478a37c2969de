"""Multi-host mode against real ssh: OpenSSH's server runs inside each namespace of a veth
pair (started per connection by the client's ProxyCommand, `sshd -i`), so every command of a
run goes through ssh exactly as it would to a Chameleon or CloudLab node."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from xfer_bench import hosts, netns
from xfer_bench.dataplane import DEFAULT_XFER
from xfer_bench.wan import NETNS_ETC

SSHD = "/usr/sbin/sshd"

EXPERIMENT = """
name = "two-hosts"
duration_s = 6
mi = "500ms"
[path]
rate_mbit = 1000
rtt_ms = 50
[[transfers]]
streams = 2
[[transfers]]
streams = 2
start_s = 1
[[transfers]]
streams = 2
[[variants]]
name = "mixed"
optimizer = "gd"
tool = ["xfer", "iperf3", "gridftp"]
"""


def test_the_example_hosts_file_loads():
    example = hosts.load(Path(__file__).resolve().parents[1] / "hosts.example.toml")
    assert example.receiver.ssh == "cc@192.5.87.10" and example.senders[0].ssh is None
    assert example.receiver_port == 50000 and example.rate_mbit == 10000


def test_hosts_file_mistakes_are_named():
    good = '[receiver]\nssh = "local"\naddr = "10.0.0.2"\n[[senders]]\nssh = "a@b"\n'
    parsed = hosts.parse(good)
    assert parsed.receiver.ssh is None and parsed.senders[0].ssh == "a@b"
    assert parsed.sender(2) == parsed.senders[0], "one sender sends every transfer"
    two = hosts.parse(good + '[[senders]]\nssh = "c@d"\n')
    with pytest.raises(RuntimeError, match="2 senders for 3 transfers"):
        hosts.check(two, 3, {"xfer"})
    for text, message in [
        ("[[senders]]\nssh = 'x'\n", "missing \\[receiver\\]"),
        (good.replace('addr = "10.0.0.2"\n', ""), "missing addr"),
        (good.replace('ssh = "a@b"', 'host = "a@b"'), "unknown keys \\['host'\\]"),
        (
            good.replace('ssh = "a@b"', 'ssh = "a@b"\nport = 9'),
            "sender 1: unknown keys \\['port'\\]",
        ),
        (good + "[extra]\n", "unknown keys \\['extra'\\]"),
        ('[receiver]\nssh = "local"\naddr = "x"\n', "at least one"),
    ]:
        with pytest.raises(ValueError, match=message):
            hosts.parse(text)


needs_ssh = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SSHD) or not shutil.which("ssh"),
    reason="needs root, OpenSSH's server and client (scripts/test installs them)",
)


@pytest.fixture
def two_hosts(tmp_path):
    """A veth pair whose two namespaces each answer ssh; yields (hosts file, topology)."""
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", keys / name],
                       check=True)  # fmt: skip
    (keys / "authorized_keys").write_text((keys / "id.pub").read_text())
    config = keys / "sshd_config"
    config.write_text(
        f"HostKey {keys / 'host_key'}\nAuthorizedKeysFile {keys / 'authorized_keys'}\n"
        "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nLogLevel ERROR\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    with netns.veth_pair("xh") as topo:
        # Like a real host, each namespace resolves its own name (GridFTP's server needs it).
        for ns, addr in ((topo.sender_ns, "10.201.0.1"), (topo.receiver_ns, topo.receiver_addr)):
            etc = NETNS_ETC / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{addr} {socket.gethostname()}\n")
        host_key = (keys / "host_key.pub").read_text().split()[:2]
        (keys / "known_hosts").write_text(
            "".join(f"{ns} {' '.join(host_key)}\n" for ns in (topo.sender_ns, topo.receiver_ns))
        )
        options = [
            "-F", "/dev/null", "-i", str(keys / "id"),
            "-o", f"UserKnownHostsFile={keys / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"ProxyCommand=ip netns exec %h {SSHD} -i -f {config}",
        ]  # fmt: skip
        text = (
            f'[receiver]\nssh = "root@{topo.receiver_ns}"\naddr = "{topo.receiver_addr}"\n'
            f'xfer = "{DEFAULT_XFER}"\ngridftp_port_range = "50100,50199"\n'
            f'[[senders]]\nssh = "root@{topo.sender_ns}"\nxfer = "{DEFAULT_XFER}"\n'
            f"[ssh]\noptions = {json.dumps(options)}\n[path]\nrate_mbit = 10000\n"
        )
        path = tmp_path / "hosts.toml"
        path.write_text(text)
        try:
            yield path, topo
        finally:
            for ns in (topo.sender_ns, topo.receiver_ns):
                shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)


def _left_in(topo: netns.Topology) -> list[str]:
    """Processes still running in either namespace, and scratch directories left behind."""
    left = []
    for ns in (topo.sender_ns, topo.receiver_ns):
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        for pid in out.stdout.split():
            try:
                left.append(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
            except (FileNotFoundError, ProcessLookupError):
                pass  # ended meanwhile (the open or the read can fail, by when it ended)
    return left


def _scratch_dirs() -> set[str]:
    return {str(p) for p in Path("/tmp").glob("xfer-bench.*")}


@needs_ssh
def test_an_experiment_runs_between_hosts_over_ssh(two_hosts, tmp_path):
    hosts_file, topo = two_hosts
    source = tmp_path / "two-hosts.toml"
    source.write_text(EXPERIMENT)
    out = tmp_path / "out"
    before = _scratch_dirs()
    cmd = [sys.executable, "-m", "xfer_bench.run_experiment", str(source), "--hosts",
           str(hosts_file), "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    runs = json.loads((out / "runs.json").read_text())
    transfers = runs[0]["transfers"]
    assert all(t["error"] is None for t in transfers), transfers
    assert all(t["mean_mbit"] > 50 for t in transfers), transfers
    # The receiver's host was measured for load, and each sender's CPU came back over ssh.
    assert transfers[0]["cpu_s"] > 0.05 and transfers[1]["cpu_s"] > 0.05, transfers
    mi_log = (out / "mixed-r1" / "T1.mi.jsonl").read_text().splitlines()
    assert len(mi_log) >= 6 and json.loads(mi_log[0])["controller"] == "gd"
    assert _left_in(topo) == [] and _scratch_dirs() == before


@needs_ssh
def test_an_interrupted_run_leaves_nothing_on_any_host(two_hosts, tmp_path):
    hosts_file, topo = two_hosts
    source = tmp_path / "long.toml"
    source.write_text(EXPERIMENT.replace("duration_s = 6", "duration_s = 60"))
    before = _scratch_dirs()
    cmd = [sys.executable, "-m", "xfer_bench.run_experiment", str(source), "--hosts",
           str(hosts_file), "--out", str(tmp_path / "out")]  # fmt: skip
    run = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    senders = ("xfer send", "iperf3 -c", "globus-url-copy")

    def all_sending() -> bool:
        running = " | ".join(_left_in(topo))
        return all(s in running for s in senders)

    try:
        deadline = time.monotonic() + 30
        while not all_sending() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert all_sending(), f"not all senders started; {run.poll()=}"
        # GridFTP's data connections arrive on the ports the hosts file opened for them.
        ss = ["ip", "netns", "exec", topo.receiver_ns, "ss", "-Htn", "state", "established"]
        connections = subprocess.run(ss, capture_output=True, text=True).stdout.splitlines()
        local_ports = {int(line.split()[2].rsplit(":", 1)[1]) for line in connections}
        assert any(50100 <= p <= 50199 for p in local_ports), local_ports
    finally:
        # Interrupted like Ctrl-C, also when an assertion above failed.
        run.send_signal(signal.SIGINT)
        run.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _left_in(topo) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _left_in(topo) == [] and _scratch_dirs() == before


@needs_ssh
def test_a_missing_program_is_named_before_anything_starts(two_hosts):
    hosts_file, topo = two_hosts
    broken = hosts.parse(hosts_file.read_text().replace(str(DEFAULT_XFER), "/nonexistent/xfer"))
    with pytest.raises(RuntimeError, match=f"root@{topo.receiver_ns} lacks /nonexistent/xfer"):
        hosts.check(broken, 3, {"xfer", "iperf3"})
