"""What an upstream version bump breaks: every symbol of the lock, compared between two upstream
versions. The engine only: the upgrade workflow that drives it (``codegen drift``,
:mod:`codegen.drift_run`; ``codegen audit``, :mod:`codegen.audit`) stands above
:mod:`codegen.pipeline`, which itself runs :func:`~codegen.drift.compare.compare` for upstream
files that differ from their pins, so this package never imports the pipeline.

One job per module:

* :mod:`~codegen.drift.sides`: one upstream version, and what drift reads of a symbol there;
* :mod:`~codegen.drift.symbols`: per recorded symbol (removed, moved, kind, signature, body);
* :mod:`~codegen.drift.renames`: a removed symbol's successor, and edits re-anchored on it;
* :mod:`~codegen.drift.forks`: each fork's edits re-applied to the new body;
* :mod:`~codegen.drift.contracts`: contracts of relied-on methods on the new bodies;
* :mod:`~codegen.drift.call_sites`: AFD's own calls bound against the new signatures;
* :mod:`~codegen.drift.ours`: where in this repository each finding lands;
* :mod:`~codegen.drift.model_registry`: the architectures AFD registers for, in vLLM's registry;
* :mod:`~codegen.drift.compare`: all of the above for one lock, as one list of findings.

This package re-exports nothing: importers name the module.

Detection yields :class:`~codegen.findings.Finding` objects; :mod:`codegen.report` renders them.
Severity follows what AFD does with the symbol:

* block: generation against the new version would fail or be wrong without a human: a removed
  base, fork or override target, a changed signature of something we override or fork, a lost or
  ambiguous anchor, an ``extend`` name upstream now defines, a broken contract of a relied-on
  method (what AFD would do wrong is in the message), a call in AFD's own code that no longer
  binds, a member it reads that is gone;
* review: the code still generates, but behaviour we depend on may have changed: a forked body
  upstream edited (outside our anchors: the generated code changes with it; inside: 3-way), the
  signature of something we call or import, a contract now matching elsewhere, MRO;
* info: everything else that changed: inherited bodies nobody relies on, relied-on bodies whose
  contracts all hold, bodies our overrides replace without calling ``super()`` (only their
  signature matters), purely cosmetic changes (formatting, comments, docstrings, bare annotations).

A removed symbol with a successor in the same module (a compatible signature or a near-identical
body) is one "renamed" finding that lists every forked call site and the re-anchored edits.

A symbol that cannot be analysed is a DRF060 finding, never a silent skip.
"""
