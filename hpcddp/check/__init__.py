"""`hpcddp check`, the pre-flight: every rank's facts, timed collectives, node pairs and compute,
read into one table and one line per problem.

Rank side (torch in preflight only; checkup and table are pure). May import `hpcddp.comm` and
everything below it; `hpcddp.cli` and `hpcddp.slurm.tasks` import it inside functions.
"""
