"""``python -m tools.gpu_check``: the GPU check (:mod:`tools.gpu_check.cli`)."""

import sys

from tools.gpu_check.cli import main
from tools.harness.cli import exit_on_sigterm

exit_on_sigterm()  # a check cut off from outside keeps its report and leaves no engine
sys.exit(main())
