"""Loggers that show up in vLLM's output, and the exit a worker takes on a fatal failure.

vLLM configures handlers for the ``vllm`` logger hierarchy only, so AFD loggers live under it
(``vllm.afd.<module>``) and their lines appear, prefixed like vLLM's, in every vLLM process.
"""

from __future__ import annotations

import logging
import os


def get_logger(module: str) -> logging.Logger:
    """``get_logger(__name__)`` -> ``vllm.afd.connectors.gloo`` for ``afd_models.connectors.gloo``."""
    return logging.getLogger("vllm.afd." + module.removeprefix("afd_models."))


def exit_process(exc: BaseException) -> None:
    """End the worker process, logging why, so the engine reports the failure.

    vLLM watches its worker processes: a dead worker turns its engine's ``/health`` into an error
    instead of an engine that looks healthy but serves nothing (or waits forever on a peer).
    """
    logging.getLogger("vllm.afd").critical("AFD worker exits: %s", exc)
    logging.shutdown()
    os._exit(70)
