"""Operator and maintainer tools, run from the repository root.

* ``python3 tools/cpu_env.py`` (also ``python -m tools.cpu_env``): the project's CPU environment,
  one per supported vLLM release; runnable with a bare Python from any directory.
* ``python -m tools.gpu_check``: the AFD CUDA runtime against native vLLM on a GPU host.
* ``python -m tools.gpu_bundle``: vLLM's CUDA build and its wheels, carried to an offline GPU host.
* ``python -m tools.npu_check``: an AFD install on an Ascend NPU host.
* ``tools/wheel_backend.py``: the PEP 517 build backend (``pyproject.toml``, ``backend-path``),
  loaded by the build front end as the top-level module ``wheel_backend``.

:mod:`tools.harness` is what the checks and the bundle share: the command-line plumbing, engine
results, engine processes. Every command exits with the project's codes
(:class:`afd_models.commandline.ExitCode`, docs/maintainers.md): 0 clean, 2 a check found a problem,
3 bad usage, a host that cannot run the command, or the tool itself failed.
"""
