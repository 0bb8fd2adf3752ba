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


def test_the_quota_itself_is_read_in_cpus_v1_and_v2(tmp_path):
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "cpu.cfs_quota_us").write_text("15000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    free = tmp_path / "free"
    free.mkdir()
    (free / "cpu.cfs_quota_us").write_text("-1\n")
    (free / "cpu.cfs_period_us").write_text("100000\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("200000 100000\n")
    assert cpu_quota.limit_cpus([free, v1, v2]) == 0.15  # the tightest level
    assert cpu_quota.limit_cpus([free]) == 0.0 and cpu_quota.limit_cpus([tmp_path / "x"]) == 0.0


def test_a_quota_too_small_for_the_node_s_ranks_is_named_even_when_it_did_not_bind():
    """On a machine so busy that the quota never bound during the probe, the node is barely
    slower; its quota (0.15 CPUs for 2 ranks) still starves the job once it trains."""
    ranks = with_ranks(n2={"compute_ms": 11.0, "cpu_quota": 0.15, "compute_throttled": 0.01})
    (found,) = checkup.compute_problems(ranks)
    assert found.text.startswith(
        "slow node n2: the same computation takes 11 ms there against 10 ms on the fastest "
        "node; its CPU quota (cgroup) allows 0.15 CPUs for its 2 ranks"
    )
    roomy = with_ranks(n2={"compute_ms": 11.0, "cpu_quota": 4.0})
    assert not checkup.compute_problems(roomy)  # a quota the ranks fit in is no problem
