"""``python -m tools.gpu_check``: the GPU check (:mod:`tools.gpu_check.cli`)."""

import sys

from tools.gpu_check.cli import main

sys.exit(main())
