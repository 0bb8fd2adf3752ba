"""A hang under NCCL is blamed on the node that is behind, not on the waiter NCCL aborted.

Emulated as it happens on GPUs: rank 1 (on n2) hangs before step 4's all-reduce; rank 0 (on
n1) waits in it until NCCL's watchdog aborts it (SIGABRT), so srun reports n1's task first.
Both flight recorders dump on that timeout (torch's pickle of plain values); rank 0's last
collective is 4 (started), rank 1's is 3 (completed).
"""

import json
import pickle

from hpcddp.records import attempts, nccl_blame
from hpcddp.records.nccl_blame import Dump
from hpcddp.slurm import policy

ABORTED_N1 = "srun: error: n1: task 0: Aborted"  # the waiter, killed by NCCL's watchdog

# the job script's question after srun reported n1's task aborted (NCCL's watchdog killed it)
AFTER_N1_ABORTED = ("after", "--status", "134", "--srun-errors", ABORTED_N1, "--node-states")
AFTER_N1_ABORTED += ("n1 idle\nn2 idle\nn3 idle",)


def entry(seq, state="completed", group=("0", "default_pg"), op="nccl:all_reduce"):
    return {"record_id": seq, "pg_id": 0, "process_group": group, "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": op, "state": state,
            "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"],
            "output_dtypes": ["Float"], "is_p2p": False, "retired": state == "completed",
            "time_created_ns": seq, "timeout_ms": 600000, "frames": []}  # fmt: skip


def dump_bytes(last, world=(0, 1), side_group_seq=None):
    """A flight recorder dump as torch writes it: collectives 1..last of the default group
    (the last one started, never completed), and maybe a side group's of its own count."""
    entries = [entry(seq) for seq in range(1, last)] + [entry(last, "started")]
    if side_group_seq is not None:
        entries.append(entry(side_group_seq, group=("1", "undefined")))
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(world))},
              "1": {"name": "1", "desc": "undefined", "ranks": str(list(world))}}  # fmt: skip
    return pickle.dumps({"version": "2.10", "pg_config": config, "entries": entries}, protocol=2)


def write_attempt(run_dir, dumps, hosts=("n1", "n2")):
    logs = run_dir / "logs"
    logs.mkdir(parents=True)
    for rank, host in enumerate(hosts):
        line = f"12:00:01 [rank {rank}/{len(hosts)} {host}] INFO hpcddp.train.trainer: step 3\n"
        (logs / f"rank-{rank}.log").write_text(line)
    for rank, data in dumps.items():
        (logs / f"nccl-trace-rank-{rank}").write_bytes(data)
    return logs


def test_the_hung_node_is_excluded_not_the_waiter_nccl_aborted(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_attempt(run_dir, {0: dump_bytes(4, side_group_seq=9), 1: dump_bytes(3)})
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    argv = list(AFTER_N1_ABORTED)
    argv += ["--excluded", "(null)", f"run.dir={run_dir}"]
    assert policy.main(argv, environ) == 0
    out, err = capsys.readouterr()
    assert out == "requeue 134 n2\n", err  # srun named n1; the dumps name n2
    (record,) = attempts.history(run_dir)
    assert record["cause"] == "failed: rank 1 on n2: hung" and record["excluded"] == ["n2"]
    kept = attempts.hang_dir(run_dir, "12", 0)
    assert sorted(p.name for p in kept.iterdir()) == ["nccl-trace-rank-0", "nccl-trace-rank-1"]
    assert not list((run_dir / "logs").glob("nccl-trace-rank-*"))  # read once, kept there


def test_without_dumps_srun_s_first_failed_node_is_excluded_as_before(tmp_path, capsys):
    run_dir = tmp_path / "run"
    write_attempt(run_dir, {})
    environ = {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0", "SLURM_JOB_NODELIST": "n[1-2]"}
    argv = list(AFTER_N1_ABORTED)
    assert policy.main([*argv, "--excluded", "(null)", f"run.dir={run_dir}"], environ) == 0
    assert capsys.readouterr().out == "requeue 134 n1\n"


def test_the_rank_with_the_lowest_last_collective_is_behind():
    dumps = {r: nccl_blame.parse(r, dump_bytes(seq)) for r, seq in ((0, 7), (1, 6), (2, 7))}
    blame = nccl_blame.behind({**dumps, 3: Dump(3, (), 7)})
    assert blame.ranks == (1,) and dict(blame.reached) == {0: 7, 1: 6, 2: 7, 3: 7}
    assert "rank(s) 1 never joined collective 7" in blame.why


def test_the_dumps_blame_nobody_when_a_rank_wrote_none_or_all_agree():
    two = {0: nccl_blame.parse(0, dump_bytes(5, world=(0, 1, 2))), 2: Dump(2, (), 4)}
    assert nccl_blame.behind(two).ranks == ()  # rank 1 wrote none: it may be further behind
    assert "rank(s) 1 wrote no dump" in nccl_blame.behind(two).why
    same = {r: Dump(r, (0, 1), 5) for r in (0, 1)}
    assert nccl_blame.behind(same).ranks == ()  # stuck inside it together: not one rank's fault
    assert nccl_blame.behind({}).ranks == ()


def test_a_dump_is_read_as_plain_values_only(tmp_path):
    assert nccl_blame.parse(0, dump_bytes(3)) == Dump(0, (0, 1), 3)
    evil = pickle.dumps(json.JSONDecodeError("x", "y", 0))  # no class is ever built
    assert nccl_blame.parse(0, evil) is None and nccl_blame.parse(0, b"not a pickle") is None
    logs = write_attempt(tmp_path, {}, hosts=("a", "b"))
    (logs / "rank-1.log").write_text("[rank 1/2 b] x\n[rank 1/2 c] requeued on c\n")
    assert nccl_blame.host_of(logs, 1) == "c" and nccl_blame.host_of(logs, 5) == ""


def test_the_documented_fr_trace_command_reads_dumps_when_a_rank_wrote_none(tmp_path):
    import shlex
    import subprocess
    import sys

    from hpcddp.comm.flight_recorder import READ_DUMPS

    for rank in (0, 2):  # rank 1 was killed before NCCL's timeout: no dump
        (tmp_path / f"nccl-trace-rank-{rank}").write_bytes(dump_bytes(4, world=(0, 1, 2)))
    argv = shlex.split(READ_DUMPS.replace("RUN_DIR/logs", str(tmp_path)))
    assert argv[:3] == ["python", "-m", "torch.distributed.flight_recorder.fr_trace"]
    done = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "missed FR dumps from ranks ({1})" in done.stdout + done.stderr
