"""How a run ends: the one home of the rules that decide requeue, restart on a spare node,
hand-on to a chain's next link, or stop (pure and torch-free).

Who decides: `hpcddp.resilience.rules`, asked by rank 0's stop (`hpcddp.train.stopping`), by
the job script's helper (`hpcddp.slurm.policy`, after a step; ``python -m hpcddp.resilience``
for the questions the batch shell asks in a blink: which node states are usable, and what a
signal between two steps means) and by submitit's task (`hpcddp.slurm.tasks`). Who carries a
decision out: rank 0's ``scontrol requeue`` (`hpcddp.launch.requeue`), the batch shell
(``scontrol``, ``scancel``, a new ``srun`` step) and submitit (``DelayedSubmission``); none of
them decides anything of its own.

May import the ground floor (`hpcddp.exit_codes`, `hpcddp.outcome`) and nothing above it, so
that every wing above can ask it.
"""
