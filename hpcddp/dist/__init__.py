"""The process group's life: join, bind the device, collectives, failure reports, guarded downloads.

Rank side (torch). May import the ground floor, `hpcddp.launch` and `hpcddp.storage`.
"""
