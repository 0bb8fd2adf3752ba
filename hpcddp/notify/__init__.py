"""Notices of what happens to a run (`hpcddp.run_events.Event`: started, preempted, requeued,
restarted, failed, nan, hang, completed), to a JSON webhook (``notify.url``) and a Slack or
Mattermost channel (``notify.slack_url``), as ``notify.events`` chooses.

Rank 0 tells what it sees while it runs (`notices.Notifier`); the job script's policy helper
(`hpcddp.slurm.policy`) tells what only the batch shell sees: a rank died, so the job restarts,
requeues or fails. Each receiver is a sink (`sinks.Sink`); posts leave on background threads
(`poster.Poster`): a dead or slow webhook never slows or fails training. Torch-free, stdlib
only; may import the ground floor and `hpcddp.launch`.
"""
