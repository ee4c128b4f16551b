"""The AFD overlay generator: reads pinned upstream source (never imports it), applies the edits
declared in ``overlay/`` and writes plugin-owned subclasses to ``afd_models/_generated/``.

Public entry points are the CLI (``python -m codegen``, see :mod:`codegen.cli`) and the overlay
vocabulary in :mod:`codegen.markers`.
"""
