"""What every command of the project shares on its command line: the exit codes
(:class:`ExitCode`, the table in docs/maintainers.md, "Exit codes") and the argument parser that
gives a usage error its code (:class:`CommandParser`).

Standard library only and importing nothing of the project: the floor under the runtime's
operator commands (``afd_models.cli``, ``afd_models.deploy``), the generator (``codegen``) and
the tools, so that none of them imports another for these.
"""

from __future__ import annotations

import argparse
import enum
import sys
from typing import NoReturn


class ExitCode(enum.IntEnum):
    """The exit code of every command: codegen's, the tools' and the operator commands'."""

    #: nothing found, or only info findings
    CLEAN = 0
    #: something to review, nothing blocks
    REVIEW = 1
    #: something blocks (a check failed)
    BLOCK = 2
    #: a usage error (an unknown option, package or release), or the tool itself failed (the
    #: upstream source is not available, a crash): nothing was analysed, never a pass
    ERROR = 3


class CommandParser(argparse.ArgumentParser):
    """argparse for every command: a usage error exits 3 (:attr:`ExitCode.ERROR`), not
    argparse's 2, which means "blocks"."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.ERROR, f"{self.prog}: error: {message}\n")
