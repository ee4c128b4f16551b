"""Loggers that show up in vLLM's output.

vLLM configures handlers for the ``vllm`` logger hierarchy only, so AFD loggers live under it
(``vllm.afd.<module>``) and their lines appear, prefixed like vLLM's, in every vLLM process.
"""

from __future__ import annotations

import logging


def get_logger(module: str) -> logging.Logger:
    """``get_logger(__name__)`` -> ``vllm.afd.connectors.gloo`` for ``afd_models.connectors.gloo``."""
    return logging.getLogger("vllm.afd." + module.removeprefix("afd_models."))
