"""Webhook notices of what happens to a run: started, preempted, requeued, restarted, failed,
nan, hang, completed (``notify.url``, ``notify.events``).

Rank 0 tells what it sees while it runs (`notices.Notifier`); the job script's policy helper
(`hpcddp.slurm.policy`) tells what only the batch shell sees: a rank died, so the job restarts,
requeues or fails. Posts leave on background threads (`poster.Poster`): a dead or slow webhook
never slows or fails training. Torch-free, stdlib only; may import the ground floor and
`hpcddp.launch`.
"""
