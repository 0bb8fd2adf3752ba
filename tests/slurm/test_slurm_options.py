"""The option table's new rows on the real cluster: sbatch reads each one as Slurm's own option.

The local cluster's nodes have no features and it holds no reservation, so Slurm refuses a
``--constraint`` or ``--reservation`` for what it is; a held job shows what Slurm recorded of
``--exclusive`` and the mail settings (``scontrol show job``), and is cancelled unrun.
"""

import sys

import pytest


def hpcddp_sbatch(cluster, *flags: str, dry_run: bool = False):
    """``hpcddp sbatch examples/quickstart.yaml FLAGS`` against ``cluster``."""
    command = [sys.executable, "-m", "hpcddp", "sbatch", *flags, "examples/quickstart.yaml"]
    return cluster.run(*command, *(["--dry-run"] if dry_run else []), check=False)


@pytest.mark.parametrize(
    "flag, value, refusal",
    [
        ("--constraint", "nvlink&ib", "Invalid feature specification"),
        ("--reservation", "no-such-window", "Requested reservation is invalid"),
    ],
)
def test_slurm_refuses_a_feature_or_reservation_it_lacks(slurm_cluster, flag, value, refusal):
    done = hpcddp_sbatch(slurm_cluster, flag, value)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"hpcddp: error: sbatch refused the job: {refusal}. HINT: ")


def test_slurm_records_exclusive_and_mail_as_asked(slurm_cluster, tmp_path):
    mail = ("--mail-type", "END,FAIL", "--mail-user", "me@example.org")
    script = hpcddp_sbatch(slurm_cluster, "--exclusive", *mail, dry_run=True).stdout
    assert "#SBATCH --exclusive\n" in script
    held = slurm_cluster.run("sbatch", "--parsable", "--hold", input=script, cwd=tmp_path)
    job_id = held.stdout.strip().split(";")[0]
    try:
        shown = slurm_cluster.run("scontrol", "-o", "show", "job", job_id).stdout.split()
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    fields = dict(field.split("=", 1) for field in shown if "=" in field)
    assert (fields["MailUser"], fields["MailType"]) == ("me@example.org", "END,FAIL")
    assert fields["OverSubscribe"] == "NO"  # whole nodes: what --exclusive asks for
