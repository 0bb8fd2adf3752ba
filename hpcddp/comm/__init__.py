"""Communication between ranks: join the group, bind the device, collectives, failure reports,
guarded downloads, the setup agreement and the rendezvous.

Named ``comm`` (not ``dist``, which is both ``torch.distributed``'s usual alias and the build
folder that common ``.gitignore`` templates drop). Rank side (torch). May import the ground
floor, `hpcddp.launch` and `hpcddp.storage`.
"""
