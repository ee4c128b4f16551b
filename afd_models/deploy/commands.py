"""The ``vllm serve`` command of each engine of a deployment: what an operator would type, with the
worker class and the flags each role needs (:mod:`afd_models.launch`; docs/user-guide.md, "Flags
the roles need") derived from the spec."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from afd_models.deploy.spec import BINDING_ENV, Deployment, Engine, Platform
from afd_models.launch import ROLE_ARGS, worker_class

#: environment of every engine, by platform: vLLM's CPU platform cannot run MLA
PLATFORM_ENV: Mapping[Platform, Mapping[str, str]] = {
    Platform.CPU: {"VLLM_MLA_DISABLE": "1"},
    Platform.CUDA: {},
}


@dataclass(frozen=True)
class Command:
    """One engine's command line and the environment it adds."""

    engine: Engine
    argv: tuple[str, ...]
    env: Mapping[str, str]

    def shell(self) -> str:
        """The command as one shell line (environment first), for logs and docs."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in self.env.items()]
        return " ".join([*assignments, *(shlex.quote(arg) for arg in self.argv)])


def engine_command(
    deployment: Deployment, engine: Engine, vllm: Sequence[str] = ("vllm",)
) -> Command:
    """``engine``'s ``vllm serve``, run by ``vllm`` (its CLI: the ``vllm`` script by default)."""
    argv = [
        *vllm,
        "serve",
        deployment.model,
        "--host",
        engine.host,
        "--port",
        str(engine.api_port),
        "--dtype",
        deployment.dtype,
        "--worker-cls",
        worker_class(deployment.platform.value, engine.role).path,
        "--additional-config",
        json.dumps({"afd": dict(engine.afd)}, sort_keys=True),
        *ROLE_ARGS[engine.role],
    ]
    if deployment.tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(deployment.tensor_parallel_size)]
    if engine.dp > 1:
        argv += ["--data-parallel-size", str(engine.dp)]
    if deployment.served_model_name is not None:
        argv += ["--served-model-name", deployment.served_model_name]
    argv += engine.args
    env = {**PLATFORM_ENV[deployment.platform], **engine.env}
    if engine.binding is not None:
        env[BINDING_ENV[deployment.platform]] = engine.binding
    return Command(engine, tuple(argv), env)


def deployment_commands(deployment: Deployment, vllm: Sequence[str] = ("vllm",)) -> list[Command]:
    """Every engine's command, FFN engines first (the order ``deploy up`` starts them in)."""
    return [engine_command(deployment, engine, vllm) for engine in deployment.engines]
