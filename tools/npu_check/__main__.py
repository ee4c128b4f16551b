"""``python -m tools.npu_check``: the NPU check (:mod:`tools.npu_check.cli`)."""

import sys

from tools.npu_check.cli import main

sys.exit(main())
