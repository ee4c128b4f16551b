"""The one vocabulary of every check: finding kinds with stable codes and severities, and the
exit code a list of findings gives (:class:`afd_models.commandline.ExitCode`).

Detection code yields :class:`Finding` objects; renderers (text, JSON, Markdown, SARIF) only
format them. Filter and count by ``code``, never by message text.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from afd_models.commandline import ExitCode


class Severity(enum.Enum):
    """How a finding affects the exit code."""

    INFO = "info"
    REVIEW = "review"
    BLOCK = "block"

    @property
    def rank(self) -> int:
        return {"info": 0, "review": 1, "block": 2}[self.value]


class Kind(enum.Enum):
    """Finding kinds. The value is the stable code; ``describe`` reads as a sentence."""

    # overlay declarations
    OVERLAY_INVALID = "OVL001"
    BASE_UNKNOWN = "OVL002"
    TARGET_MISSING = "OVL003"
    EXTEND_SHADOWS = "OVL004"
    NAME_CLASH = "OVL005"
    UNBOUND_NAME = "OVL006"
    # signatures
    PARAM_ADDED = "SIG001"
    PARAM_REMOVED = "SIG002"
    PARAM_RENAMED = "SIG003"
    PARAM_KIND = "SIG004"
    PARAM_DEFAULT = "SIG005"
    PARAM_ANNOTATION = "SIG006"
    RETURN_ANNOTATION = "SIG007"
    DECORATORS = "SIG008"
    ASYNC = "SIG009"
    DELTA_UNUSED = "SIG010"
    DELTA_INEXACT = "SIG011"
    PARAM_ORDER = "SIG012"
    # anchors
    ANCHOR_INVALID = "ANC001"
    ANCHOR_LOST = "ANC002"
    ANCHOR_COUNT = "ANC003"
    # contracts of relied-on upstream methods
    CONTRACT_INVALID = "CTR001"
    CONTRACT_BROKEN = "CTR002"
    CONTRACT_COUNT = "CTR003"
    # lock and generated files
    LOCK_MISSING = "LCK001"
    LOCK_DIFFERS = "LCK002"
    GENERATED_MISSING = "GEN001"
    GENERATED_STALE = "GEN002"
    # runtime (vLLM importable)
    RUNTIME_UNAVAILABLE = "RT001"
    RUNTIME_IMPORT = "RT002"
    RUNTIME_SIGNATURE = "RT003"
    RUNTIME_SHADOWS = "RT004"
    RUNTIME_PATCHED = "RT005"
    # dotted paths
    PATH_IMPORT = "PTH001"
    PATH_BASE = "PTH002"
    PATH_PLATFORM = "PTH003"
    # monkey patches
    PATCH_ATTRIBUTE = "MP001"
    PATCH_SETATTR = "MP002"
    PATCH_SYS_MODULES = "MP003"
    PATCH_MOCK = "MP004"
    PATCH_IMPORT_SYSTEM = "MP005"
    # upstream source
    UPSTREAM_MISSING = "UPS001"
    UPSTREAM_HASH = "UPS002"
    # drift between two upstream versions
    DRIFT_REMOVED = "DRF001"
    DRIFT_MOVED = "DRF002"
    DRIFT_RENAMED = "DRF003"
    DRIFT_KIND = "DRF004"
    DRIFT_PARAM_ADDED = "DRF010"
    DRIFT_PARAM_REMOVED = "DRF011"
    DRIFT_PARAM_RENAMED = "DRF012"
    DRIFT_PARAM_KIND = "DRF013"
    DRIFT_PARAM_ORDER = "DRF014"
    DRIFT_PARAM_DEFAULT = "DRF015"
    DRIFT_PARAM_ANNOTATION = "DRF016"
    DRIFT_RETURN_ANNOTATION = "DRF017"
    DRIFT_DECORATORS = "DRF018"
    DRIFT_BODY = "DRF020"
    DRIFT_INHERITED_BODY = "DRF021"
    DRIFT_CALLEE_SIGNATURE = "DRF022"
    DRIFT_CALL_SITE = "DRF023"
    DRIFT_ENVIRONMENT = "DRF024"
    DRIFT_ATTRIBUTE_TYPE = "DRF025"
    DRIFT_FIELDS = "DRF026"
    DRIFT_ANCHOR_LOST = "DRF030"
    DRIFT_ANCHOR_COUNT = "DRF031"
    DRIFT_REBASED = "DRF032"
    DRIFT_REBASE_CONFLICT = "DRF033"
    DRIFT_EXTEND_SHADOWS = "DRF040"
    DRIFT_BASES = "DRF041"
    DRIFT_MRO = "DRF042"
    DRIFT_REGISTRY = "DRF050"
    DRIFT_PLATFORM_PICK = "DRF051"
    DRIFT_CONTRACT_BROKEN = "DRF070"
    DRIFT_CONTRACT_COUNT = "DRF071"
    DRIFT_SELECTION = "DRF072"
    DRIFT_FEATURE_REMOVED = "DRF080"
    DRIFT_UNANALYSED = "DRF060"
    DRIFT_UNPAIRED = "DRF061"
    # the tool itself
    INTERNAL_ERROR = "TOOL001"

    @property
    def code(self) -> str:
        return self.value

    @property
    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS: dict[Kind, str] = {
    Kind.OVERLAY_INVALID: "the overlay declaration is not valid",
    Kind.BASE_UNKNOWN: "the overlay names a base class that upstream does not define",
    Kind.TARGET_MISSING: "an override or fork names a member upstream does not have",
    Kind.EXTEND_SHADOWS: "an extend name already exists in upstream's MRO",
    Kind.NAME_CLASH: "a generated module would bind one name to two objects",
    Kind.UNBOUND_NAME: "generated code uses a name nothing binds",
    Kind.PARAM_ADDED: "a parameter was added",
    Kind.PARAM_REMOVED: "a parameter was removed",
    Kind.PARAM_RENAMED: "a parameter was renamed",
    Kind.PARAM_KIND: "a parameter changed kind",
    Kind.PARAM_DEFAULT: "a parameter default changed",
    Kind.PARAM_ANNOTATION: "a parameter annotation changed",
    Kind.RETURN_ANNOTATION: "the return annotation changed",
    Kind.DECORATORS: "the decorators differ",
    Kind.ASYNC: "one side is async and the other is not",
    Kind.PARAM_ORDER: "parameters were reordered",
    Kind.DELTA_UNUSED: "a declared signature delta explains no difference",
    Kind.DELTA_INEXACT: "a declared signature delta does not match the difference exactly",
    Kind.ANCHOR_INVALID: "an anchor pattern or edit code does not parse",
    Kind.ANCHOR_LOST: "an anchor matches nothing",
    Kind.ANCHOR_COUNT: "an anchor matches a different number of times than declared",
    Kind.CONTRACT_INVALID: "a contract's pattern does not parse",
    Kind.CONTRACT_BROKEN: "a contract does not hold in the pinned upstream body",
    Kind.CONTRACT_COUNT: "a contract matches a different number of times than declared",
    Kind.LOCK_MISSING: "the lock file is missing",
    Kind.LOCK_DIFFERS: "the lock differs from a regeneration",
    Kind.GENERATED_MISSING: "generated code is missing",
    Kind.GENERATED_STALE: "generated code differs from a regeneration",
    Kind.RUNTIME_UNAVAILABLE: "vLLM is not importable, runtime checks did not run",
    Kind.RUNTIME_IMPORT: "a generated or upstream symbol does not import",
    Kind.RUNTIME_SIGNATURE: "the runtime signature differs from upstream",
    Kind.RUNTIME_SHADOWS: "an extend name exists on the live upstream class",
    Kind.RUNTIME_PATCHED: "a forked or relied-on method, or an imported name, is patched at run time by code from another package",
    Kind.PATH_IMPORT: "a dotted class path does not import",
    Kind.PATH_BASE: "a dotted class path does not derive from its claimed upstream base",
    Kind.PATH_PLATFORM: "an AFD class is served on a platform where vLLM builds another class",
    Kind.PATCH_ATTRIBUTE: "an attribute of an upstream module or class is assigned",
    Kind.PATCH_SETATTR: "setattr is called on an upstream module or class",
    Kind.PATCH_SYS_MODULES: "sys.modules is rebound",
    Kind.PATCH_MOCK: "a mock patch targets an upstream module or class",
    Kind.PATCH_IMPORT_SYSTEM: "an import hook is installed or a builtin replaced",
    Kind.UPSTREAM_MISSING: "the pinned upstream source is not available",
    Kind.UPSTREAM_HASH: "an upstream file does not match its pinned hash",
    Kind.DRIFT_REMOVED: "an upstream symbol was removed",
    Kind.DRIFT_MOVED: "an upstream symbol moved to another module",
    Kind.DRIFT_RENAMED: "an upstream symbol was renamed (its successor named, call sites re-anchored)",
    Kind.DRIFT_KIND: "an upstream symbol changed kind",
    Kind.DRIFT_PARAM_ADDED: "an upstream signature gained a parameter",
    Kind.DRIFT_PARAM_REMOVED: "an upstream signature lost a parameter",
    Kind.DRIFT_PARAM_RENAMED: "an upstream parameter was renamed",
    Kind.DRIFT_PARAM_KIND: "an upstream parameter changed kind",
    Kind.DRIFT_PARAM_ORDER: "upstream parameters were reordered",
    Kind.DRIFT_PARAM_DEFAULT: "an upstream default changed",
    Kind.DRIFT_PARAM_ANNOTATION: "an upstream parameter annotation changed",
    Kind.DRIFT_RETURN_ANNOTATION: "an upstream return annotation changed",
    Kind.DRIFT_DECORATORS: "upstream decorators changed",
    Kind.DRIFT_BODY: "the upstream body an override replaces changed",
    Kind.DRIFT_INHERITED_BODY: "an upstream body AFD inherits or relies on changed",
    Kind.DRIFT_CALLEE_SIGNATURE: "a name a forked body calls changed its signature",
    Kind.DRIFT_CALL_SITE: "a call in AFD's own code no longer binds to the new signature",
    Kind.DRIFT_ENVIRONMENT: "an environment variable AFD reads or sets is gone, or parsed another way",
    Kind.DRIFT_ATTRIBUTE_TYPE: "an attribute AFD calls methods on, indexes or iterates changed its type",
    Kind.DRIFT_FIELDS: "a field-built class AFD derives a class from changed its fields",
    Kind.DRIFT_ANCHOR_LOST: "a fork's anchor matches nothing in the new version",
    Kind.DRIFT_ANCHOR_COUNT: "a fork's anchor matches a different number of places in the new version",
    Kind.DRIFT_REBASED: "a fork's edits apply cleanly to the new body",
    Kind.DRIFT_REBASE_CONFLICT: "a fork's edits apply, but upstream changed the code they edit",
    Kind.DRIFT_EXTEND_SHADOWS: "an extend name now exists upstream",
    Kind.DRIFT_BASES: "an upstream class changed its bases",
    Kind.DRIFT_MRO: "the MRO of an overlaid class changed",
    Kind.DRIFT_REGISTRY: "an architecture AFD registers changed in vLLM's model registry",
    Kind.DRIFT_PLATFORM_PICK: "vLLM builds another class for an architecture AFD registers on some platform",
    Kind.DRIFT_CONTRACT_BROKEN: "the new body breaks a contract AFD relies on",
    Kind.DRIFT_CONTRACT_COUNT: "a contract still holds, but in a different number of places",
    Kind.DRIFT_SELECTION: "a selection rule changed: vLLM may build another class for AFD's roles",
    Kind.DRIFT_FEATURE_REMOVED: "an upstream module or class AFD stands on is gone, and with it "
    "the AFD roles, classes and features named",
    Kind.DRIFT_UNANALYSED: "a symbol could not be analysed",
    Kind.DRIFT_UNPAIRED: "a pinned package is not judged against a release it is not made for",
    Kind.INTERNAL_ERROR: "the tool failed",
}


@dataclass(frozen=True)
class Location:
    """A place in a file; ``line`` is 1-based, 0 when unknown."""

    path: str
    line: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else self.path


@dataclass(frozen=True)
class Finding:
    """One result of a check."""

    #: what kind of problem this is
    kind: Kind
    #: how it affects the exit code
    severity: Severity
    #: the dotted symbol the finding is about (upstream or generated)
    symbol: str
    #: the problem as a sentence, fix last
    message: str
    #: where in our files (overlay, generated, runtime)
    ours: Location | None = None
    #: where in upstream
    upstream: Location | None = None
    #: old / expected value, when there is one
    old: str | None = None
    #: new / actual value, when there is one
    new: str | None = None
    #: extra lines shown in verbose output (diffs, tracebacks)
    details: tuple[str, ...] = field(default=())
    #: where in the *new* upstream version (drift only)
    target: Location | None = None
    #: the overlay declaration behind ``ours`` when ``ours`` is the hand-written line that fails
    #: (a runtime read the overlay states a contract on, say); None when ``ours`` is it
    declared: Location | None = None
    #: the symbol of the feature finding (DRF080) that explains this one: listed under it
    folded_under: str | None = None

    @property
    def code(self) -> str:
        return self.kind.code

    def one_line(self) -> str:
        where = f" [{self.ours}]" if self.ours else (f" [{self.upstream}]" if self.upstream else "")
        return f"{self.severity.value:6} {self.code} {self.symbol}: {self.message}{where}"

    def verbose(self) -> str:
        lines = [self.one_line()]
        if self.upstream:
            lines.append(f"    upstream: {self.upstream}")
        if self.target:
            lines.append(f"    new:      {self.target}")
        if self.ours:
            lines.append(f"    ours:     {self.ours}")
        if self.declared:
            lines.append(f"    declared: {self.declared}")
        if self.folded_under:
            lines.append(f"    under:    {self.folded_under}")
        if self.old is not None:
            lines.append(f"    expected: {self.old}")
        if self.new is not None:
            lines.append(f"    actual:   {self.new}")
        lines.extend("    " + line for line in self.details)
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "kind": self.kind.name.lower(),
            "severity": self.severity.value,
            "symbol": self.symbol,
            "message": self.message,
            "ours": str(self.ours) if self.ours else None,
            "upstream": str(self.upstream) if self.upstream else None,
            "target": str(self.target) if self.target else None,
            "declared": str(self.declared) if self.declared else None,
            "folded_under": self.folded_under,
            "old": self.old,
            "new": self.new,
            "details": list(self.details),
        }


def exit_code(findings: Iterable[Finding]) -> ExitCode:
    """The exit code of a list of findings: its worst severity (errors of the tool are 3)."""
    worst = max((f.severity.rank for f in findings), default=0)
    return {0: ExitCode.CLEAN, 1: ExitCode.REVIEW, 2: ExitCode.BLOCK}[worst]


def summary(findings: Iterable[Finding]) -> str:
    """One line of counts, e.g. ``2 block, 1 review, 0 info``."""
    counts = {s: 0 for s in Severity}
    for f in findings:
        counts[f.severity] += 1
    return ", ".join(
        f"{counts[s]} {s.value}" for s in (Severity.BLOCK, Severity.REVIEW, Severity.INFO)
    )
