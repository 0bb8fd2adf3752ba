"""Who am I: hostlists, launch contexts, rank/world/master resolution, ports, the local launcher.

Torch-free (torch is imported lazily, only to count GPUs): this wing runs on login nodes and
at the start of every rank. May import the ground floor (`hpcddp.config`, `hpcddp.errors`,
`hpcddp.exit_codes`, `hpcddp.progress`) and nothing above it.
"""
