"""``python -m tools.gpu_bundle``: the bundle's commands (:mod:`tools.gpu_bundle.cli`)."""

import sys

from tools.gpu_bundle.cli import main

sys.exit(main())
