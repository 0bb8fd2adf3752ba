"""A CPU quota's hold on a rank, read from the kernel's cgroup counters (fake trees here), and
the check's rule that names a throttled node even where shared cores hide most of it."""

from hpcddp.check import checkup, cpu_quota
from tests.unit.test_checkup import with_ranks


def test_cgroup_v1_reads_the_most_throttled_level_up_the_tree(tmp_path):
    job = tmp_path / "cpu" / "slurmd-n1" / "job_7"
    job.mkdir(parents=True)
    (tmp_path / "cpu" / "slurmd-n1" / "cpu.stat").write_text(
        "nr_periods 40\nnr_throttled 38\nthrottled_time 3400000000\n"
    )
    (job / "cpu.stat").write_text("nr_periods 40\nnr_throttled 0\nthrottled_time 0\n")
    dirs = cpu_quota.cgroup_dirs("4:memory:/x\n2:cpu,cpuacct:/slurmd-n1/job_7\n", tmp_path)
    assert dirs[:3] == [job, job.parent, tmp_path / "cpu"]
    assert cpu_quota.throttled_s(dirs) == 3.4  # the limit sits on the node's folder


def test_cgroup_v2_reads_throttled_usec(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    step = tmp_path / "system.slice" / "step_0"
    step.mkdir(parents=True)
    (step / "cpu.stat").write_text("usage_usec 10\nnr_throttled 3\nthrottled_usec 250000\n")
    dirs = cpu_quota.cgroup_dirs("0::/system.slice/step_0\n", tmp_path)
    assert dirs[0] == step and cpu_quota.throttled_s(dirs) == 0.25


def test_nothing_readable_is_no_throttle(tmp_path):
    assert cpu_quota.throttled_s(cpu_quota.cgroup_dirs("1:cpu:/gone\n", tmp_path)) == 0.0
    assert cpu_quota.cgroup_dirs("", tmp_path) == []


def test_a_node_held_back_by_its_quota_is_named_though_shared_cores_narrow_the_gap():
    ranks = with_ranks(n2={"compute_ms": 21.0, "compute_throttled": 0.8})  # n1: 10 ms
    (found,) = checkup.compute_problems(ranks)
    assert found.text.startswith(
        "slow node n2: the same computation takes 21 ms there against 10 ms on the fastest "
        "node; a CPU quota (cgroup) stopped its ranks for 80% of the probe"
    )
    assert not checkup.compute_problems(with_ranks(n2={"compute_ms": 21.0}))  # only slower
    assert not checkup.compute_problems(with_ranks(n2={"compute_throttled": 0.8}))  # not slower
