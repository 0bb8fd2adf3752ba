"""A run's records: what it says about itself beside its weights, and the sweeps and chains it
belongs to.

The run directory's preparation and lock holder (`rundir`, `runinfo`), metrics.jsonl and the
trackers (`metrics_log`, `tracking`), plots (`charts`), attempts and their cost (`attempts`,
`cost`), where the code came from (`provenance`), and the records of sweeps and chains
(`sweep_manifest`, `chain_record`). File names come from `hpcddp.run_files`.

Written by rank 0 and read on the login node, so never torch: may import the ground floor and
`hpcddp.storage` (atomic writes, the run lock).
"""
