"""The one error ``verify`` reports instead of a result."""

from __future__ import annotations


class VerifyError(ValueError):
    """The config cannot be verified, or a run failed; the message says why and what to change."""
