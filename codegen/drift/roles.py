"""The AFD roles a generated class serves, from the worker-class table
(:data:`afd_models.launch.WORKER_CLASSES`: one row per platform and role, its worker and its
runners by the vLLM runner they are for): what drift names when a change takes classes away
(:mod:`codegen.drift.features`) or changes the rule that picks them (a selection rule,
:mod:`codegen.drift.contracts`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from afd_models.config import Role
from afd_models.launch import WORKER_CLASSES, Runner, WorkerClass
from codegen.model import package_of


@dataclass(frozen=True)
class RoleLoss:
    """What one role (a row of the table) loses when some classes go."""

    row: WorkerClass
    #: the runners it loses, by vLLM runner (all of them: the role is down)
    lost: tuple[Runner, ...]
    #: its worker class itself is among the classes gone
    worker_lost: bool

    @property
    def down(self) -> bool:
        """Whether nothing of the role stands: its worker, or every runner it builds, is gone."""
        return self.worker_lost or set(self.lost) == set(self.row.runners)

    def describe(self) -> str:
        """``the FFN role on cpu`` (down), or ``the Attention role on cuda loses Model Runner V1
        (Model Runner V2 stands: AFDAttentionGPUModelRunnerV2)``."""
        name = role_name(self.row)
        if self.down:
            return name
        kept = [r for r in self.row.runners if r not in self.lost]
        lost = ", ".join(runner_name(r) for r in self.lost)
        stands = "; ".join(
            f"{runner_name(r)} stands: {self.row.runners[r].rpartition(':')[2]}" for r in kept
        )
        return f"{name} loses {lost} ({stands})"


#: how a report names each role
ROLE_NAMES = {Role.ATTENTION: "Attention", Role.FFN: "FFN"}


def role_name(row: WorkerClass) -> str:
    """``the Attention role on cpu``."""
    return f"the {ROLE_NAMES[row.role]} role on {row.platform}"


def runner_name(runner: Runner) -> str:
    """``Model Runner V1``."""
    return f"Model Runner {runner.name}"


def role_losses(gone: Collection[str], judged: Iterable[str] | None = None) -> list[RoleLoss]:
    """The roles whose worker or runners are among the generated classes ``gone`` (lock keys,
    ``module:Class``); ``judged``: the generated packages judged (a row of another is left out),
    None: all."""
    packages = set(judged) if judged is not None else None
    losses = []
    for row in WORKER_CLASSES:
        if packages is not None and package_of(row.generated) not in packages:
            continue
        lost = tuple(r for r, cls in row.runners.items() if cls in gone)
        if lost or row.generated in gone:
            losses.append(RoleLoss(row, lost, row.generated in gone))
    return losses


def runners_gone(losses: Iterable[RoleLoss]) -> list[Runner]:
    """The vLLM runners that every role building one loses (among the roles judged: those of the
    packages of ``losses``' rows)."""
    losses = list(losses)
    packages = {package_of(loss.row.generated) for loss in losses}
    rows = [row for row in WORKER_CLASSES if package_of(row.generated) in packages]
    lost = {(loss.row.generated, runner) for loss in losses for runner in loss.lost}
    return [
        runner
        for runner in Runner
        if any(runner in row.runners for row in rows)
        and all((row.generated, runner) in lost for row in rows if runner in row.runners)
    ]


def roles_of(classes: Iterable[str]) -> list[str]:
    """The roles a set of generated classes serve (as workers or runners), by name."""
    keys = set(classes)
    return [
        role_name(row)
        for row in WORKER_CLASSES
        if row.generated in keys or keys & set(row.runners.values())
    ]
