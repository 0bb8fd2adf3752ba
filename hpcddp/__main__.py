"""``python -m hpcddp`` is the ``hpcddp`` command, as every rank runs it (srun, torchrun).

It leaves a success or a Ctrl-C without the interpreter's teardown (`hpcddp.leaving`, whose exit
handler is registered before anything else). A local launch's ranks run the same, forked from a
zygote (`hpcddp.cli.zygote`).
"""

from hpcddp import leaving

leaving.register()

from hpcddp.cli import main  # noqa: E402  (after the handler: its exit handlers run first)

leaving.leave(main())
