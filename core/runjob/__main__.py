"""``python -m runjob`` is the ``runjob`` command (also for ``torchrun -m runjob``)."""

from runjob.commands.cli import main

raise SystemExit(main())
