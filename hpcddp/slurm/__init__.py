"""Talking to Slurm from the login node: job scripts, submission and sweeps, queue, status, index.

Torch-free at import: submission hands the trainer (`hpcddp.train`) to submitit, importing it
only inside the callable that runs in the job. May import the ground floor, `hpcddp.launch` and
`hpcddp.storage`'s torch-free modules.
"""
