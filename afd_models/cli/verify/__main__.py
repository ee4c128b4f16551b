"""``python -m afd_models.cli.verify``: see :mod:`afd_models.cli.verify.run`."""

import sys

from afd_models.cli.verify.run import main

sys.exit(main())
