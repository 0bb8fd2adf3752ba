"""Death (or hang) -> first new step, on the local Slurm cluster: requeue, and 2 nodes + 1 spare.

Usage (root, from the repository root)::

    python -m tests.benchmarks.recovery                      # requeue arm, a rank killed, 3 runs
    python -m tests.benchmarks.recovery --failure hang       # a rank hung (dist.hang_timeout_s)
    python -m tests.benchmarks.recovery --arms requeue spare # with the spare-node restart
    python -m tests.benchmarks.recovery --slurm-conf PATH    # on a running cluster (3+ nodes)

Each run is a real ``sbatch`` job of the quickstart on two nodes, one rank per node. Once it
has logged a step, the benchmark names the second node as bad: its rank dies at its next step
(`tests.fixtures.bad_node`) or hangs there (`tests.fixtures.hang_node`, with
``dist.hang_timeout_s``). The times come from the run's own records
(`hpcddp.records.attempts.last_recovery`): failure detected, every rank gone, the next attempt
started, its checkpoint loaded, its first step done; all from the moment the node was named
(the failure itself follows within one step, a few ms here). Every Python reads hpcddp from
compiled bytecode, as from an installed package.

Arms: ``requeue`` is today's path, ``scontrol requeue`` without the node; Slurm then holds the
job ~120 s (BeginTime), which the benchmark lifts as soon as the job is pending, as a
scheduler with free nodes would start it (``--keep-hold`` measures the hold too). ``spare``
submits three nodes with ``slurm.spare_nodes=1`` (the restart inside the job, issue 16 item
1): selectable now, it runs once that key exists on the branch.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from hpcddp.records import attempts

REPO = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = REPO / "tests" / "cluster" / "local-slurm.sh"
NODES = 3  # two to train on, and one for the requeued job or the spare
FIXTURES = {"death": "tests.fixtures.bad_node", "hang": "tests.fixtures.hang_node"}
HANG_TIMEOUT_S = 20


def start_cluster(instance: str) -> dict[str, str]:
    """The benchmark's own cluster; the environment its clients need."""
    env = {**os.environ, "HPCDDP_SLURM_INSTANCE": instance, "HPCDDP_SLURM_NODES": str(NODES)}
    subprocess.run(["bash", str(CLUSTER), "start"], env=env, check=True, capture_output=True)
    printed = subprocess.run(["bash", str(CLUSTER), "env"], env=env, check=True,
                             capture_output=True, text=True).stdout  # fmt: skip
    exported = dict(line.removeprefix("export ").split("=", 1) for line in printed.splitlines())
    return {**os.environ, "SLURM_CONF": exported["SLURM_CONF"].strip("'\"")}


def compiled(env: dict[str, str], cache: pathlib.Path) -> dict[str, str]:
    """``env`` whose Pythons read hpcddp from compiled bytecode, as an installed package is read.

    With ``PYTHONDONTWRITEBYTECODE`` set (some shells set it), every rank of every restart would
    compile hpcddp's sources anew, a cost no installed package has.
    """
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    subprocess.run([sys.executable, "-m", "compileall", "-q", "hpcddp", "tests", "examples"],
                   env=env, cwd=REPO, check=True, capture_output=True)  # fmt: skip
    return env


def slurm(env: dict[str, str], *command: str) -> str:
    """A Slurm command's output; fails loudly."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done.stdout


def fields(env: dict[str, str], job: str) -> dict[str, str]:
    """``scontrol -o show job``'s fields."""
    shown = slurm(env, "scontrol", "-o", "show", "job", job)
    return dict(f.split("=", 1) for f in shown.split() if "=" in f)


def wait_for(env: dict[str, str], job: str, check, what: str, timeout: float = 300) -> None:
    """Poll the job's fields every 0.2 s until ``check(fields)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check(fields(env, job)):
            return
        time.sleep(0.2)
    raise SystemExit(f"job {job}: {what} did not happen within {timeout:.0f} s")


def submit(
    env: dict[str, str], arm: str, failure: str, work: pathlib.Path
) -> tuple[str, pathlib.Path]:
    """One job of ``arm``; its id and the file naming the node that fails."""
    bad = work / "bad-host"
    kwargs = f"{{host_file: {bad}, at_call: 10{', rank: 1' if failure == 'hang' else ''}}}"
    config = [
        f"run.dir={work / 'run'}", "data.kwargs={train_size: 4096, eval_size: 256}",
        "data.batch_size=32", "train.epochs=3", "train.checkpoint_every_steps=8",
        "train.log_every_steps=1",
        f"model.factory={FIXTURES[failure]}:make_model", f"model.kwargs={kwargs}",
        *([f"dist.hang_timeout_s={HANG_TIMEOUT_S}"] if failure == "hang" else []),
        *(["slurm.spare_nodes=1"] if arm == "spare" else []),
    ]  # fmt: skip
    nodes = 3 if arm == "spare" else 2
    options = [
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--output={work}/%x-%j.out",
        f"--job-name=recovery-{arm}",
        f"--export=ALL,HPCDDP_PYTHON={sys.executable}",
    ]
    script = ["sbatch/train.sh", "examples/quickstart.yaml", *config]
    job = slurm(env, "sbatch", "--parsable", *options, *script).strip().split(";")[0]
    return job, bad


def one_run(env: dict[str, str], arm: str, failure: str, work: pathlib.Path, hold: bool) -> dict:
    """Seconds from naming the bad node to each recovery time, for one job."""
    work.mkdir(parents=True)
    job, bad = submit(env, arm, failure, work)
    try:
        wait_for(env, job, lambda f: f.get("JobState") == "RUNNING", "start", timeout=120)
        training(work / "run" / "metrics.jsonl", timeout=300)  # start-up is not the failure's
        hosts = slurm(env, "scontrol", "show", "hostnames", fields(env, job)["NodeList"]).split()
        bad.write_text(hosts[1])
        named = time.time()
        if arm == "requeue":
            wait_for(env, job, _requeued, "the requeue")
            if not hold:
                slurm(env, "scontrol", "update", f"JobId={job}", "StartTime=now+2")
        wait_for(env, job, lambda f: f.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
                 "the end", timeout=600)  # fmt: skip
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, check=False)
    if fields(env, job).get("JobState") != "COMPLETED":
        out = next(work.glob(f"*-{job}.out"), None)
        raise SystemExit(f"job {job} did not complete:\n{out.read_text()[-3000:] if out else ''}")
    rec = attempts.last_recovery(work / "run")
    if rec is None or rec.first_step is None:
        raise SystemExit(f"job {job}: no recovery on record in {work / 'run'}")
    times = {"detected": rec.detected, "gone": rec.gone, "started": rec.started,
             "loaded": rec.loaded, "first_step": rec.first_step}  # fmt: skip
    seconds: dict = {name: (at or named) - named for name, at in times.items()}
    return {**seconds, "restarts": fields(env, job).get("Restarts")}


def training(metrics: pathlib.Path, timeout: float) -> None:
    """Wait until rank 0 has logged a step: the ranks train, and fail within their next step."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metrics.exists() and '"step"' in metrics.read_text():
            return
        time.sleep(0.1)
    raise SystemExit(f"no step logged in {metrics} within {timeout:.0f} s")


def _requeued(shown: dict[str, str]) -> bool:
    return shown.get("JobState") == "PENDING" and shown.get("Restarts") == "1"


COLUMNS = ("detected", "gone", "started", "loaded", "first_step")


def report(results: dict[str, list[dict]], failure: str) -> str:
    """Medians side by side, then every run."""
    lines = [f"{failure} -> (median s)  " + "  ".join(f"{c:>10}" for c in COLUMNS)]
    for arm, runs in results.items():
        medians = [statistics.median(r[c] for r in runs) for c in COLUMNS]
        lines.append(f"{arm:<18}  " + "  ".join(f"{m:>10.1f}" for m in medians))
    for arm, runs in results.items():
        for r in runs:
            lines.append(f"  {arm} run: " + ", ".join(f"{c} {r[c]:.1f}" for c in COLUMNS)
                         + f", Restarts={r['restarts']}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.recovery")
    parser.add_argument("--arms", nargs="+", default=["requeue"], choices=["requeue", "spare"])
    parser.add_argument("--failure", default="death", choices=sorted(FIXTURES))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep-hold", action="store_true", help="leave Slurm's requeue hold")
    parser.add_argument(
        "--instance",
        default=os.environ.get("HPCDDP_SLURM_INSTANCE", "8"),
        help="local cluster instance to start (1-9; HPCDDP_SLURM_INSTANCE)",
    )
    parser.add_argument("--slurm-conf", help="use this running cluster (3+ nodes), not our own")
    args = parser.parse_args(argv)
    env = start_cluster(args.instance) if args.slurm_conf is None else {
        **os.environ, "SLURM_CONF": args.slurm_conf}  # fmt: skip
    results: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory(prefix="hpcddp-recovery-") as tmp:
        env = compiled(env, pathlib.Path(tmp) / "bytecode")
        for run in range(args.runs):
            for arm in args.arms:
                work = pathlib.Path(tmp) / f"{arm}-{run}"
                results[arm].append(one_run(env, arm, args.failure, work, args.keep_hold))
                print(json.dumps({arm: results[arm][-1]}), flush=True)
    print(report(results, args.failure))
    print("(from the moment the bad node was named; timings on a shared machine are noisy)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
