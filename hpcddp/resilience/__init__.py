"""How a run ends: the one home of the rules that decide requeue, restart on a spare node,
hand-on to a chain's next link, or stop (pure and torch-free).

Who decides: `hpcddp.resilience.rules`, asked by rank 0's stop (`hpcddp.train.stopping`), by
the job script's helper (`hpcddp.slurm.policy`, after a step; ``python -m hpcddp.resilience``
for the questions the batch shell asks in a blink: which node states are usable, and what a
signal between two steps means) and by submitit's task (`hpcddp.slurm.tasks`). Who carries a
decision out: rank 0's ``scontrol requeue`` (`hpcddp.resilience.requeue`), the batch shell
(``scontrol``, ``scancel``, a new ``srun`` step) and submitit (``DelayedSubmission``); none of
them decides anything of its own.

Beside the rules live the two facts and acts of the job seen from inside it: when it must end
(`deadline`) and putting it back in the queue (`requeue`, an executor that decides nothing).

May import the ground floor (`hpcddp.errors`, `hpcddp.exit_codes`, `hpcddp.outcome`) and
nothing above it, so that every wing above can ask it.
"""
