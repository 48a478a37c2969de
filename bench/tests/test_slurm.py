"""The Slurm cluster of namespaces that striped transfers are launched on (issue 44)."""

import os
import subprocess

import pytest

from xfer_bench import netns, slurm

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
