"""``python -m afd_models.deploy``: one AFD deployment from a spec file (afd_models/deploy/spec.py).

    python -m afd_models.deploy check SPEC          # validate; print each engine's command
    python -m afd_models.deploy up SPEC [--log-dir DIR] [--timeout-s S] [--detach]
    python -m afd_models.deploy down SPEC [--log-dir DIR]
    python -m afd_models.deploy k8s SPEC            # Kubernetes manifests (YAML) on stdout

``up`` starts every engine (FFN engines first), each in a process group of its own with its log
and Prometheus directory in the log directory, waits until each answers ``/health`` (a line for
each, and one every 30 s naming those still starting), prints where to send requests, and stops everything on Ctrl-C or
SIGTERM, or when an engine exits. With ``--detach`` it returns once all are up; ``down`` stops
them then, from the process groups ``up`` recorded in the log directory. ``check`` and ``up``
refuse a spec the workers would refuse, their shared secret included, before anything starts.
"""

from __future__ import annotations

import sys
from pathlib import Path

from afd_models import supervisor
from afd_models.commandline import CommandParser, ExitCode
from afd_models.config import AFDConfigError
from afd_models.deploy.commands import deployment_commands
from afd_models.deploy.k8s import manifests, reference_errors
from afd_models.deploy.run import check_secrets, default_log_dir, down, say, up
from afd_models.deploy.spec import SpecError, load_spec


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m afd_models.deploy", description=__doc__)
    parser.add_argument("command", choices=["check", "up", "down", "k8s"])
    parser.add_argument("spec", type=Path, help="the deployment's spec file (TOML)")
    parser.add_argument("--log-dir", type=Path, help="default: ./afd-deploy-<spec name>")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="for every engine to start")
    parser.add_argument("--detach", action="store_true", help="return once every engine is up")
    args = parser.parse_args(argv)
    try:
        deployment = load_spec(args.spec)
    except SpecError as exc:
        print(f"python -m afd_models.deploy: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    log_dir = args.log_dir or default_log_dir(args.spec)
    if args.command == "check":
        try:
            check_secrets(deployment)
        except AFDConfigError as exc:
            print(f"python -m afd_models.deploy: {args.spec}: {exc}", file=sys.stderr)
            return ExitCode.ERROR
        for command in deployment_commands(deployment):
            print(command.shell())
        return ExitCode.CLEAN
    if args.command == "down":
        return down(log_dir)
    if args.command == "k8s":
        import yaml  # vLLM depends on it; imported here, where it is used

        try:
            objects = manifests(deployment)
        except SpecError as exc:
            print(f"python -m afd_models.deploy: {args.spec}: {exc}", file=sys.stderr)
            return ExitCode.ERROR
        broken = reference_errors(objects)
        if broken:  # a bug of the renderer, never a pass
            print(f"python -m afd_models.deploy: {'; '.join(broken)}", file=sys.stderr)
            return ExitCode.ERROR
        print(yaml.safe_dump_all(objects, sort_keys=False), end="")
        return ExitCode.CLEAN
    try:
        return up(deployment, log_dir, args.timeout_s, args.detach)
    except AFDConfigError as exc:  # before any engine started
        print(f"python -m afd_models.deploy: {args.spec}: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except supervisor.SupervisorError as exc:  # a serve.ServerError too
        say(f"failed: {exc}")
        return ExitCode.ERROR


if __name__ == "__main__":
    sys.exit(main())
