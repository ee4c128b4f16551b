"""Carry vLLM 0.26.0 (CUDA) to a GPU host that has torch 2.11 but no vLLM and no package index.

    python -m tools.gpu_bundle build --out DIR                      # networked machine
    python -m tools.gpu_bundle assemble --parts DIR --into DIR2     # verify, join, extract wheels
    python -m tools.gpu_bundle install --parts DIR [--target DIR3]  # GPU host: offline pip install

The bundle holds what the GPU check's engine processes import of vLLM's dependency closure, as
wheels, minus what the GPU host already has: ``torch==2.11.0`` and torch's own closure, found by
resolving ``torch==2.11.0`` alone for the same Python and platform and subtracting those
distributions by name. Of the rest it keeps the distributions the check imports (measured, and
read from vLLM's CUDA path: :mod:`~tools.gpu_bundle.trim`) and strips from the vllm wheel the
files a one-GPU sm_90 check never loads; ``manifest.json`` lists every dropped distribution and
stripped file with its size and why (docs/gpu.md). Where vLLM's resolution picked another version
of a host distribution that vLLM needs (``setuptools<81`` on Python 3.12), that version travels
too, as an *alternate*; it comes from a resolution that includes torch, so it satisfies torch
2.11.0 as well.

The wheels go into one uncompressed tar (wheels are compressed already) cut into parts of at most
``--part-mib`` MiB (48 by default): files reach the GPU host in transfers of at most 64 MiB that
also carry the checkout, so a part must fit beside it and the build refuses one that does not.
``manifest.json`` records every wheel, every part and the whole archive by size and sha256.

``assemble``, ``install`` and ``--help`` need only the standard library (``install`` also runs the
host's pip). ``build`` needs pip and a Python of the target version, because pip evaluates
environment markers (``python_version > "3.11"``) with the interpreter that runs it, whatever
``--python-version`` says.

One job per module: :mod:`~tools.gpu_bundle.manifest` (what a bundle is),
:mod:`~tools.gpu_bundle.trim` (what the check needs of vLLM's closure),
:mod:`~tools.gpu_bundle.build` (resolve, download, pack), :mod:`~tools.gpu_bundle.install` (the
GPU host's side), :mod:`~tools.gpu_bundle.cli`. Exit codes: 0 done; 3 bad usage, or the bundle
cannot be built, verified or installed (the message says why).
"""
