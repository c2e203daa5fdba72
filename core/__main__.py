"""``python -m runjob`` is the ``runjob`` command (also for ``torchrun -m runjob``)."""

from runjob.cli import main

raise SystemExit(main())
