"""What the GPU check, the NPU check and the GPU bundle share.

* :mod:`tools.harness.cli`: usage errors, the parser and crash guard that give the exit codes,
  progress lines, the JSON report file.
* :mod:`tools.harness.results`: the engine spec a child reads and the result the parent builds.
* :mod:`tools.harness.processes`: starting, bounding and killing engine processes (parent side).
* :mod:`tools.harness.child`: the engine processes' side (spec, result, exit).

Standard library only (and the standard-library-only :mod:`afd_models.commandline`), like every
module the checks import in the parent process.
"""
