"""A rendezvous port every rank derives alone, identically, without talking to the others.

Blind formulas collide: two ``srun`` steps of one job, or a port in Linux's ephemeral range
(32768-60999) that the kernel just handed to some outgoing connection. We fold the job id,
the array task id and the step id into a range below the ephemeral one, stepping linearly
with the step id so consecutive steps of one job never share a port.
"""

import sys
import zlib

PORT_BASE = 20000
PORT_SPAN = 12000  # ports 20000..31999: above common services, below the ephemeral range
EPHEMERAL_RANGE = (32768, 60999)


def derive_port(job_id: str, step_id: str = "0", array_task_id: str = "") -> int:
    """Return the rendezvous port for one job step; equal inputs give equal ports."""
    job_key = zlib.crc32(f"{job_id}/{array_task_id}".encode())
    step = int(step_id) if str(step_id).isdigit() else zlib.crc32(str(step_id).encode())
    return PORT_BASE + (job_key + step) % PORT_SPAN


if __name__ == "__main__":  # the torchrun job script derives its rendezvous port with this
    print(derive_port(*sys.argv[1:4]))
