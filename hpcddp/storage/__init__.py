"""Bytes on disk: atomic writes, checkpoints and their digests, memory mapping, snapshots,
pinned chunks, locks.

A run's records (metrics, trackers, attempts, sweeps, chains) live above, in `hpcddp.records`,
and use these. May import the ground floor; torch only where tensors are stored
(`hpcddp.storage.checkpoint`, and its parts `snapshot` and `mapped`), so the login node can
lock a run directory and write a file without it.
"""
