"""``python -m senslab``: the ``senslab`` command (:func:`senslab.cli.main`), for an environment
whose scripts folder is not on the PATH."""

from senslab.cli import main

raise SystemExit(main())
