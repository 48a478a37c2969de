"""The Slurm cluster of namespaces that striped transfers are launched on (issue 44), a
striped transfer launched on it with `srun` a node at a time, and one whose head starts the
nodes with `srun` from inside an allocation."""

import json
import os
import subprocess
from contextlib import ExitStack

import pytest

from xfer_bench import dataplane, netns, slurm, sshd

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def slurm_processes() -> list[str]:
    out = subprocess.run(["pgrep", "-a", "-x", "slurmd|slurmctld|munged"], capture_output=True)
    return out.stdout.decode().splitlines()


def test_the_configuration_names_every_node_and_the_controller(tmp_path):
    nodes = [slurm.Node("dtn1", "ns1", "10.0.0.11"), slurm.Node("dtn2", "ns2", "10.0.0.12")]
    conf = slurm._config(tmp_path, nodes, "10.0.0.1", 20000)
    assert "SlurmctldHost=ctl(10.0.0.1)" in conf
    assert "NodeName=dtn2 NodeAddr=10.0.0.12" in conf
    assert "PartitionName=dtn Nodes=dtn1,dtn2 Default=YES" in conf
    cluster = slurm.Cluster(conf=tmp_path / "slurm.conf", nodes=tuple(nodes))
    assert cluster.srun(["hostname"], nodes=1)[:2] == ["srun", "--nodes=1"]


@needs_root
def test_srun_runs_a_task_in_each_node_namespace_and_everything_is_torn_down(tmp_path):
    before = slurm_processes()
    tag = f"xsl{os.getpid() % 10000}"
    with netns.bridged(tag, 3, subnet="10.203.0") as hosts:
        nodes = [slurm.Node(f"dtn{i}", ns, addr) for i, (ns, addr) in enumerate(hosts, 1)]
        with slurm.slurm_cluster(nodes, "10.203.0.1", tmp_path / "slurm") as cluster:
            assert set(cluster.node_states().values()) == {"idle"}
            task = 'echo "$SLURM_NODEID $(hostname) $(ip -4 -o addr show dev eth0)"'
            out = subprocess.run(
                cluster.srun(["sh", "-c", task]),
                env=cluster.env, check=True, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
        lines = sorted(out.stdout.splitlines())
        assert [line.split()[:2] for line in lines] == [
            ["0", "dtn1"],
            ["1", "dtn2"],
            ["2", "dtn3"],
        ], out.stdout
        for line, (_, addr) in zip(lines, hosts, strict=True):
            assert f" {addr}/24 " in line, "each task runs in its node's network namespace"
    assert slurm_processes() == before, "every daemon stopped"
    assert not [ns for ns in netns.namespaces() if ns.startswith(tag)]


@needs_root
def test_a_cluster_that_cannot_come_up_says_why_and_leaves_nothing_running(tmp_path):
    before = slurm_processes()
    # A node whose namespace does not exist: its slurmd cannot start, so it never goes idle.
    # Its address is on loopback, where nothing answers the controller.
    nodes = [slurm.Node("dtn1", "xfer-no-such-namespace", "127.0.0.2")]
    with pytest.raises(RuntimeError, match="not all idle"):
        with slurm.slurm_cluster(nodes, "127.0.0.1", tmp_path / "slurm", start_timeout_s=5):
            pass
    assert slurm_processes() == before


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _write_tree(src):
    """Two files of several 16 MiB pieces, an empty one and small ones, in four directories."""
    for i, size in enumerate([40 << 20, 25 << 20, 1, 0, *range(1000, 60000, 1500)]):
        path = src / f"d{i % 4}" / f"f{i:02}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))


@needs_root
def test_a_striped_transfer_launched_with_srun_arrives_byte_identical(tmp_path):
    # Three sending nodes under Slurm and three receiving nodes, all on one LAN, sharing this
    # machine's file system: `srun` starts one `xfer send --stripe` per node, each task taking
    # its index from SLURM_PROCID and its receiver from a list by the same index.
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    src = tmp_path / "src" / "run9"
    _write_tree(src)
    (tmp_path / "dst").mkdir()
    before = slurm_processes()
    tag = f"xss{os.getpid() % 10000}"
    with netns.bridged(tag, 6, subnet="10.204.0") as hosts, ExitStack() as stack:
        senders, receivers = hosts[:3], hosts[3:]
        nodes = [slurm.Node(f"dtn{i}", ns, addr) for i, (ns, addr) in enumerate(senders, 1)]
        targets = []
        for i, (ns, addr) in enumerate(receivers):
            topo = netns.Topology(f"node{i}", addr, receiver_ns=ns)
            rx = stack.enter_context(dataplane.xfer_receiver(xfer, topo, tmp_path / "dst"))
            dataplane.write_key_file(rx, tmp_path / f"key{i}")
            targets.append(f"{rx.addr}:incoming")
        (tmp_path / "targets").write_text("\n".join(targets) + "\n")
        task = (
            'i=$SLURM_PROCID; exec "$0" send "$1" "$(sed -n "$((i + 1))p" "$2")" '
            '--key-file "$3$i" --stripe "$i/$SLURM_NTASKS" --json'
        )
        argv = ["sh", "-c", task, str(xfer), str(src), str(tmp_path / "targets")]
        argv.append(str(tmp_path / "key"))
        with slurm.slurm_cluster(nodes, "10.204.0.1", tmp_path / "slurm") as cluster:
            out = subprocess.run(
                cluster.srun(argv), env=cluster.env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summaries = [json.loads(x) for x in out.stdout.splitlines() if '"summary"' in x]
    assert len(summaries) == 3, out.stdout
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert sum(s["bytes"] for s in summaries) == total
    assert all(s["bytes"] > 0 for s in summaries), "each node sent its share"
    assert _tree(tmp_path / "dst" / "incoming" / "run9") == _tree(src)
    assert slurm_processes() == before, "every daemon stopped"
    assert not [ns for ns in netns.namespaces() if ns.startswith(tag)]


@needs_root
def test_the_head_starts_each_sending_node_with_srun_inside_an_allocation(tmp_path):
    # Three sending nodes under Slurm and three receiving nodes with an sshd each, on one LAN:
    # the head runs inside an allocation of the three (`salloc`), starts each node's sender as
    # a step of it with srun (the transfer sealed with the cluster's MUNGE) and each receiver
    # over ssh.
    xfer = dataplane.DEFAULT_XFER
    assert xfer.exists(), "build xfer first (scripts/test runs cargo test --release before pytest)"
    src = tmp_path / "src" / "run9"
    _write_tree(src)
    dst = tmp_path / "dst" / "incoming"
    (tmp_path / "ssh").mkdir()
    before = slurm_processes()
    tag = f"xsh{os.getpid() % 10000}"
    with netns.bridged(tag, 6, subnet="10.205.0") as hosts, ExitStack() as stack:
        senders, receivers = hosts[:3], hosts[3:]
        nodes = [slurm.Node(f"dtn{i}", ns, addr) for i, (ns, addr) in enumerate(senders, 1)]
        servers = {f"r{i}": host for i, host in enumerate(receivers)}
        config = stack.enter_context(sshd.ssh_servers(servers, tmp_path / "ssh"))
        cluster = stack.enter_context(slurm.slurm_cluster(nodes, "10.205.0.1", tmp_path / "slurm"))
        (tmp_path / "nodes").write_text("".join(f"dtn{i} r{i - 1}\n" for i in range(1, 4)))
        head = [str(xfer), "send", "--nodes", str(tmp_path / "nodes"), "--launcher", "srun"]
        head += ["--munge-socket", str(cluster.munge_socket), str(src), str(dst), "--json"]
        head += ["--ssh-command", f"ssh -F {config}", "--remote-xfer", str(xfer)]
        out = subprocess.run(
            ["salloc", "--nodes=3", "--quiet", *head],
            env=cluster.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        # A sealed transfer opens once (that only its sealer opens it: srun_start.rs's tests).
        munge = ["--socket", str(cluster.munge_socket)]
        argv = ["munge", *munge, "--string", "{}"]
        sealed = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        subprocess.run(
            ["unmunge", *munge], input=sealed, capture_output=True, text=True, check=True
        )
        argv = [str(xfer), "send", "--over-srun", "--munge-socket", str(cluster.munge_socket)]
        refused = subprocess.run(argv, input=sealed, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 1 and "Replayed credential" in refused.stderr, refused
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.splitlines()[-1])
    runs = summary["runs"]
    assert [(r["node"], r["sender"]) for r in runs] == [(0, "dtn1"), (1, "dtn2"), (2, "dtn3")]
    assert all(r["bytes"] > 0 and "failed" not in r for r in runs), runs
    total = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    assert summary["bytes"] == total, summary
    assert _tree(dst / "run9") == _tree(src)
    assert slurm_processes() == before, "every daemon stopped"
    assert not [ns for ns in netns.namespaces() if ns.startswith(tag)]
