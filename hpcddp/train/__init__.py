"""The trainer: model, data, optimizer, the loop, evaluation, checkpoints, preemption, logs.

Rank side (torch). May import everything below it: the ground floor, `hpcddp.launch`,
`hpcddp.storage` and `hpcddp.comm`.
"""
