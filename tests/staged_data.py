"""The quickstart data, read through a node-local copy of a (pretend) shared dataset folder."""

import hpcddp
from examples.quickstart import make_dataset as make_quickstart_dataset


def make_dataset(shared: str, local: str, **kwargs):
    """Stage ``shared`` into ``local`` once per node (as a real factory would), then build."""
    staged = hpcddp.stage(shared, local)
    assert (staged / "labels.txt").read_text() == "ok\n"  # every rank reads the whole copy
    return make_quickstart_dataset(**kwargs)
