"""A module that raises while it is imported, as user code with a mistake at module level does."""

SETTINGS = {"width": 256}
WIDTH = SETTINGS["depth"]  # the mistake: a KeyError at import time


def make_model():
    """Never reached: the import fails first."""
