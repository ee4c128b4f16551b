"""Project sessions. `nox -l` lists them; README.md says which two a newcomer needs.

Two kinds of environment:

* the **CPU env** (vLLM 0.26.0 on the CPU platform, ~6 GB) built by tools/cpu_env.py outside the
  checkout and reused by every clone (a stamp records its recipe); `tests`, `check` and `demo`
  run in it; `tests` also builds one per other supported release (overlay/pins.toml) for its
  `every_release` tests of the cpu and e2e_cpu tiers;
* small nox venvs (`reuse_venv`) for the source-only tools: `regenerate`, `drift`, `audit` read
  upstream vLLM from its wheel in the download cache and never import it; `lint` runs ruff and mypy;
  `manifests` validates the deployment's Kubernetes manifests with kubernetes-validate.

`npu-check` runs in neither: it uses the interpreter nox runs under, the operator's NPU environment.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

#: Test directories in the order they run: cheapest tiers first.
TEST_TIERS = ("unit", "upstream", "cpu", "e2e_cpu", "gpu", "npu")
#: Tiers of pure-Python work that start no engine: run by two pytest workers (the upstream tier's
#: drift runs are single-threaded, about 11 minutes of the run on one core). The others run in
#: one process: their engines pin cores of their own.
PARALLEL_TIERS = ("unit", "upstream")
PARALLEL_WORKERS = "2"
#: Tiers `nox -s tests` must run here; a skip of one of these is an error, not a pass.
REQUIRED_TIERS = ("unit", "upstream", "cpu", "e2e_cpu")
#: pytest's list of the slowest tests after each run: what the CI time budget is made of
DURATIONS = "--durations=15"


def _cpu_env(session: nox.Session, *args: str) -> str:
    """What `python -m tools.cpu_env ARGS` prints, run by nox's own interpreter in the checkout
    (it needs only the standard library; its progress goes to stderr as it runs)."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.cpu_env", *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    if done.returncode != 0:
        session.error(f"python -m tools.cpu_env {' '.join(args)} exited with {done.returncode}")
    return done.stdout.strip()


def _supported_versions(session: nox.Session) -> list[str]:
    """The vLLM releases overlay/pins.toml supports, the primary first."""
    return _cpu_env(session, "versions").split()


def _cpu_python(session: nox.Session, version: str | None = None) -> str:
    """Create or reuse the CPU env of ``version`` (default: the primary pin; progress on stderr)
    and return its python."""
    release = version or _supported_versions(session)[0]
    session.log(f"preparing the CPU env of vLLM {release}; a first build installs ~6 GB")
    return _cpu_env(session, "ensure", "--vllm-version", release)


#: CPU envs built at once: a build mostly unpacks and writes wheels, so two take about as long
#: as one on the 2-core machine (measured: 81 s for two, 76 s for one; four at once, 210 s)
ENV_BUILDS_AT_ONCE = 2
#: where `tests` keeps each env build's output (a local scratch directory, git-ignored)
ENV_LOGS = ROOT / ".afd-work" / "cpu-envs"


def _cpu_pythons(session: nox.Session) -> dict[str, str]:
    """The python of every supported release's CPU env, the primary first, each created or
    reused, :data:`ENV_BUILDS_AT_ONCE` at a time; each build's output goes to its log in
    :data:`ENV_LOGS`, a line marks its start and end, and a failed one ends the session with
    the end of its log."""
    versions = _supported_versions(session)
    ENV_LOGS.mkdir(parents=True, exist_ok=True)

    def ensure(version: str) -> tuple[int, str, Path]:
        log = ENV_LOGS / f"vllm-{version}.log"
        session.log(
            f"preparing the CPU env of vLLM {version} (a first build installs ~6 GB): {log}"
        )
        started = time.monotonic()
        with log.open("w") as err:
            done = subprocess.run(
                [sys.executable, "-m", "tools.cpu_env", "ensure", "--vllm-version", version],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        session.log(f"the CPU env of vLLM {version}: {time.monotonic() - started:.0f} s")
        return done.returncode, done.stdout.strip(), log

    with ThreadPoolExecutor(ENV_BUILDS_AT_ONCE) as pool:
        results = dict(zip(versions, pool.map(ensure, versions), strict=True))
    for version, (code, _, log) in results.items():
        if code != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            session.error(
                f"the CPU env of vLLM {version} failed (exit {code}), end of {log}:\n{tail}"
            )
    return {version: python for version, (_, python, _) in results.items()}


def _regenerate_with(session: nox.Session, python: str) -> None:
    session.run(python, "-m", "codegen", "regenerate", external=True)


#: The static checks `tests` runs on the tree as committed, before anything regenerates, for every
#: supported vLLM release: a lock that a commit forgot to regenerate fails here, naming
#: `nox -s regenerate`.
COMMITTED_CHECK = ("-m", "codegen", "check", "--no-runtime", "--all-versions")
#: Tiers run again on each supported release other than the primary, in that release's CPU env:
#: only their tests marked `every_release` (the CI time budget, docs/environment.md), among them
#: `codegen check` with the runtime checks for that release (tests/cpu/test_checks_runtime.py).
RELEASE_TIERS = ("cpu", "e2e_cpu")
RELEASE_MARKER = "every_release"


def _check_committed_with(session: nox.Session, python: str) -> None:
    session.log("checking the committed lock and overlay against a regeneration (static checks)")
    session.run(python, *COMMITTED_CHECK, external=True)


#: The CI budget, in minutes of wall time on the 2-core machine, of each step of a cold fresh-clone
#: run of `.ci/run` (`release`: each other release's leg); docs/testing.md has the same table,
#: with the lines reserved for the next tiers (tests/unit/test_ci_budget.py keeps the two equal).
#: Each session prints its steps' times beside their lines when it ends, also on a failure.
BUDGET_MIN: dict[str, float] = {
    "envs": 3.5,
    "lint": 1,
    "static": 2.5,
    "unit+upstream": 7,
    "primary": 11,
    "release": 2.5,
    "manifests": 0.5,
}


#: the step of the static checks and every regeneration of the primary's code
STATIC_STEP = "static checks and regenerations"


@dataclass
class Clock:
    """The wall time of each step of `tests`, against its line of :data:`BUDGET_MIN`."""

    #: step -> (its budget's key, seconds so far): a step that runs twice adds up
    steps: dict[str, tuple[str, float]] = field(default_factory=dict)

    @contextlib.contextmanager
    def step(self, name: str, budget: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            _, before = self.steps.get(name, (budget, 0.0))
            self.steps[name] = (budget, before + time.monotonic() - started)

    def table(self) -> list[str]:
        lines = ["wall time of each step against its budget (docs/testing.md):"]
        for name, (budget, seconds) in self.steps.items():
            over = "  OVER BUDGET" if seconds > BUDGET_MIN[budget] * 60 else ""
            lines.append(f"  {name:<36} {seconds / 60:5.1f} of {BUDGET_MIN[budget]:g} min{over}")
        return lines

    def report(self, session: nox.Session) -> None:
        for line in self.table():
            session.log(line)


@contextlib.contextmanager
def _timed(session: nox.Session, name: str, budget: str) -> Iterator[None]:
    """A session's whole work as one step of the budget, reported when it ends."""
    clock = Clock()
    try:
        with clock.step(name, budget):
            yield
    finally:
        clock.report(session)


@nox.session(venv_backend="none")
def tests(session: nox.Session) -> None:
    """Static checks on the committed tree, every test tier this machine can run (gpu and npu skip with a reason), then the cpu and e2e_cpu tiers on each other supported vLLM release."""
    clock = Clock()
    try:
        # every release's env first: one that cannot be built fails the run before any tier starts
        with clock.step("the CPU envs", "envs"):
            pythons = _cpu_pythons(session)
        # the deployment manifests' schema check needs kubernetes-validate, which the CPU envs lack
        session.notify("manifests")
        run_tests(session, pythons, clock)
    finally:
        clock.report(session)


def run_tests(session: nox.Session, pythons: dict[str, str], clock: Clock | None = None) -> None:
    """The commands of `tests`, given each supported release's python (the primary first)."""
    clock = clock or Clock()
    (primary, python), *others = pythons.items()
    with clock.step(STATIC_STEP, "static"):
        _check_committed_with(session, python)
        _regenerate_with(session, python)
    serial_tiers = [tier for tier in TEST_TIERS if tier not in PARALLEL_TIERS]
    session.log(f"the {', '.join(PARALLEL_TIERS)} tiers on vLLM {primary}, two pytest workers")
    with clock.step(f"{' + '.join(PARALLEL_TIERS)} on {primary}", "unit+upstream"):
        session.run(
            python,
            "-m",
            "pytest",
            *(f"tests/{tier}" for tier in PARALLEL_TIERS),
            "-n",
            PARALLEL_WORKERS,
            DURATIONS,
            *session.posargs,
            external=True,
            env={"AFD_REQUIRED_TIERS": ",".join(PARALLEL_TIERS)},
        )
    session.log(f"the {', '.join(serial_tiers)} tiers on vLLM {primary}")
    with clock.step(f"{' + '.join(serial_tiers)} on {primary}", "primary"):
        session.run(
            python,
            "-m",
            "pytest",
            *(f"tests/{tier}" for tier in serial_tiers),
            DURATIONS,
            *session.posargs,
            external=True,
            env={"AFD_REQUIRED_TIERS": ",".join(t for t in REQUIRED_TIERS if t in serial_tiers)},
        )
    # afd_models/_generated holds one release's code: each other release's for its tiers, then
    # the primary's again, once, for the checkout
    try:
        for version, other in others:
            session.log(f"the {', '.join(RELEASE_TIERS)} tiers on vLLM {version} (its own CPU env)")
            with clock.step(f"{RELEASE_MARKER} on {version}", "release"):
                _regenerate_with(session, other)
                session.run(
                    other,
                    "-m",
                    "pytest",
                    *(f"tests/{tier}" for tier in RELEASE_TIERS),
                    "-m",
                    RELEASE_MARKER,
                    DURATIONS,
                    *session.posargs,
                    external=True,
                    env={"AFD_REQUIRED_TIERS": ",".join(RELEASE_TIERS)},
                )
    finally:
        if others:
            with clock.step(STATIC_STEP, "static"):
                _regenerate_with(session, python)


@nox.session(venv_backend="none", default=False)
def check(session: nox.Session) -> None:
    """`python -m codegen check` in the CPU env: signatures (static and runtime), lock, dotted paths, no monkey patches."""
    python = _cpu_python(session)
    session.run(python, "-m", "codegen", "check", *session.posargs, external=True)


@nox.session(venv_backend="none", default=False)
def demo(session: nox.Session) -> None:
    """Build a tiny DeepSeek model, serve it as an AFD Attention+FFN pair and a plain baseline, compare."""
    python = _cpu_python(session)
    _regenerate_with(session, python)
    session.run(python, "-m", "afd_models.cli.demo", *session.posargs, external=True)


@nox.session(reuse_venv=True, default=False)
def regenerate(session: nox.Session) -> None:
    """Regenerate afd_models/_generated/ and the lock of every supported vLLM release from overlay/ and pinned upstream source."""
    session.install("-e", ".[codegen]")
    session.run("python", "-m", "codegen", "regenerate", "--all-versions", *session.posargs)


@nox.session(reuse_venv=True, default=False)
def drift(session: nox.Session) -> None:
    """What a vLLM bump breaks: `nox -s drift -- 0.33.0` compares that version with the newest
    supported release below it (`-- 0.33.0 --from 0.26.0` for another base)."""
    if not session.posargs:
        session.error("give the target version: nox -s drift -- 0.28.0")
    session.install("-e", ".[codegen]")
    target, *rest = session.posargs
    session.run("python", "-m", "codegen", "drift", "--to", target, *rest)


@nox.session(reuse_venv=True, default=False)
def audit(session: nox.Session) -> None:
    """Upgrade audit report for `nox -s audit -- 0.28.0`: drift + dry-run regeneration + work list."""
    if not session.posargs:
        session.error("give the target version: nox -s audit -- 0.28.0")
    session.install("-e", ".[codegen]")
    target, *rest = session.posargs
    session.run("python", "-m", "codegen", "audit", "--to", target, *rest)


#: the Kubernetes release the deployment manifests are validated against, and its schemas
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"


@nox.session(reuse_venv=True, default=False)
def manifests(session: nox.Session) -> None:
    """The Kubernetes manifests of `python -m afd_models.deploy k8s`, validated against the Kubernetes schema and checked for cross-references (run by `tests`)."""
    with _timed(session, "the manifests' schema check", "manifests"):
        session.install("-e", ".", KUBERNETES_VALIDATE, "pytest==9.0.2")
        session.run(
            "python",
            "-m",
            "pytest",
            "tests/unit/test_deploy_k8s.py",
            "-q",
            "-p",
            "no:cacheprovider",
            env={"AFD_KUBERNETES_SCHEMA": "required"},
        )


@nox.session(reuse_venv=True)
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) on the project and mypy --strict on codegen/, afd_models/ and tools/."""
    with _timed(session, "lint", "lint"):
        session.install("-e", ".[codegen]", "mypy==2.4.1", "types-PyYAML==6.0.12.20250915")
        session.run("ruff", "check", ".")
        session.run("ruff", "format", "--check", ".")
        session.run("mypy")


@nox.session(venv_backend="none", default=False)
def benchmarks(session: nox.Session) -> None:
    """Codegen speed, proxy overhead, serving and connector overhead, drift quality, release cost; results go to docs/benchmarks.md."""
    python = _cpu_python(session)
    _regenerate_with(session, python)
    names = session.posargs or [
        "codegen_speed",
        "proxy_overhead",
        "serving",
        "drift_quality",
        "release_cost",
    ]
    for name in names:
        session.run(python, f"benchmarks/{name}.py", external=True)
    if "serving" in names:
        session.notify("plots")


#: the plotting library `plots` installs (the CPU env has none, and needs none)
MATPLOTLIB = "matplotlib==3.11.2"


@nox.session(reuse_venv=True, default=False)
def plots(session: nox.Session) -> None:
    """Draw docs/plots/serving.png from the figures `benchmarks/serving.py` wrote (`benchmarks` runs it after serving)."""
    session.install(MATPLOTLIB)
    session.run("python", "benchmarks/plot_serving.py")


@nox.session(name="npu-check", venv_backend="none", default=False)
def npu_check(session: nox.Session) -> None:
    """Validate an Ascend NPU install (run `python -m nox` with the NPU environment's Python): codegen check with vLLM-Ascend's patches, one-layer parity."""
    session.run(sys.executable, "-m", "tools.npu_check", *session.posargs, external=True)
