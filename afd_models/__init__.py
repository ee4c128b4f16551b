"""AFD for MoE models on vLLM: the runtime package.

Importing it imports nothing heavy and checks nothing, so the ``vllm.general_plugins`` entry point
(:func:`afd_models.plugin.register`, which registers the AFD architectures by name) cannot break a
vLLM run that does not use AFD. vLLM selects the pieces by dotted paths: ``--worker-cls
afd_models.workers.AFDAttentionCPUWorker`` and the registered model classes. The generated code
(``afd_models/_generated``, written by ``nox -s regenerate`` or the wheel build) is checked before
it runs: by the AFD workers (which also report it missing) and by its own registry when first
imported, so an AFD worker of a stale checkout fails at start with the command that fixes it.
The commands operators run (tiny models, ``verify``, the demo) are :mod:`afd_models.cli`, which
the runtime never imports; the runtime never imports the generator (``codegen``) either.
"""
