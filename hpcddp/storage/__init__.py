"""Files a run leaves behind: the run directory, atomic writes, checkpoints, metrics, plots, sweeps.

Written by rank 0, read by every rank. May import the ground floor and `hpcddp.launch`;
torch only where tensors are stored (`hpcddp.storage.checkpoint`, and its parts
`snapshot` and `mapped`), so the login node can read a run's metrics and draw its plots
without it.
"""
