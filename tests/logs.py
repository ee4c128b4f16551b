"""The AFD log lines a test collects while it runs (vLLM's loggers do not propagate to pytest's
capture)."""

from __future__ import annotations

import logging


class AFDLines(logging.Handler):
    """The messages AFD's modules (``vllm.afd.*``) log at INFO and above while it is attached:
    ``with AFDLines() as lines: ...``."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.logger = logging.getLogger("vllm.afd")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.logger.addHandler(self)
        self.level_before = self.logger.level
        self.logger.setLevel(logging.INFO)
        return self.lines

    def __exit__(self, *_: object) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level_before)
