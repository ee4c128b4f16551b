"""Kubernetes manifests of a deployment spec: what ``python -m afd_models.deploy k8s SPEC`` prints.

Per deployment ``N`` (the spec's ``[kubernetes] name``):

* the FFN ranks: one StatefulSet ``N-ffn`` of ``ffn.ranks`` pods, each pod's FFN rank its ordinal
  (``rank_offset`` from the pod's host name), and the headless Service ``N-ffn`` that gives pod
  ``k`` the stable name ``N-ffn-k.N-ffn``, which is FFN rank ``k``'s entry in ``ffn_hosts``: the
  FFN engine listens for its group there, and its Attention peers connect to it. The Service
  publishes pods before they are ready, since an FFN engine's API server comes up only once its
  peers connected.
* each Attention engine ``i``: a StatefulSet ``N-attention<i>`` of one pod (its DP ranks run
  inside it, as vLLM data parallel does) and a Service ``N-attention<i>`` for its API.
* in every pod: readiness and liveness on ``/health`` (a startup probe covers loading and
  compiling), the model's volume claim mounted read-only, the shared secret from the Kubernetes
  Secret the spec names (``AFD_AUTH_TOKEN``), ``PROMETHEUS_MULTIPROC_DIR`` on a volume of its own,
  and Prometheus's scrape annotations.

A role whose engine spans nodes (vLLM's multi-node TP) needs a LeaderWorkerSet; it is refused
here by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from afd_models.config import Role
from afd_models.deploy.commands import engine_command
from afd_models.deploy.spec import Cluster, Deployment, Engine, SpecError
from afd_models.topology import group_port

Manifest = dict[str, Any]
#: the label every object of a deployment carries, and the one naming its part
APP_LABEL, PART_LABEL = "app.kubernetes.io/instance", "afd.vllm.ai/part"
PROMETHEUS_DIR = "/tmp/afd-prometheus"
#: the key of the Secret's token
SECRET_KEY = "token"


def manifests(deployment: Deployment) -> list[Manifest]:
    """Every object of the deployment, Services before the workloads that need them.

    Raises:
        SpecError: the spec has no ``[kubernetes]`` table, or one these objects cannot follow.
    """
    cluster = deployment.cluster
    if cluster is None:
        raise SpecError(
            "a [kubernetes] table is required for its manifests (name, image, model_claim)"
        )
    if cluster.secret is None and not deployment.engines[0].config.allow_unauthenticated:
        raise SpecError(
            "kubernetes.secret is required: the FFN ranks listen on the cluster network, and "
            "their workers refuse to start without the deployment's shared secret; allowed: the "
            "name of a Secret whose 'token' key holds it, or afd.allow_unauthenticated = true"
        )
    config = deployment.engines[0].config
    if cluster.secret is not None and (config.allow_unauthenticated or config.auth_token_file):
        key = "allow_unauthenticated" if config.allow_unauthenticated else "auth_token_file"
        raise SpecError(
            f"kubernetes.secret={cluster.secret!r} with afd.{key} is not allowed: the pods take "
            "the shared secret from the Secret, and the workers refuse a second source or "
            "allow_unauthenticated beside a secret; allowed: one of them"
        )
    if not deployment.model.startswith(cluster.model_mount.rstrip("/") + "/"):
        raise SpecError(
            f"model={deployment.model!r} is not allowed with kubernetes.model_mount="
            f"{cluster.model_mount!r}: the pods see the model only on its volume; allowed: a "
            "path under model_mount"
        )
    ffn_service = f"{cluster.name}-ffn"
    hosts = [f"{ffn_service}-{k}.{ffn_service}" for k in range(len(deployment.ffn_engines))]
    objects: list[Manifest] = [_ffn_service(deployment, cluster, ffn_service)]
    objects.append(_ffn_statefulset(deployment, cluster, ffn_service, hosts))
    for engine in deployment.attention_engines:
        name = f"{cluster.name}-{engine.name}"
        objects.append(_service(cluster, name, engine.name, [("api", engine.api_port)]))
        objects.append(_statefulset(deployment, cluster, name, name, engine, hosts, replicas=1))
    return objects


def _labels(cluster: Cluster, part: str) -> dict[str, str]:
    return {APP_LABEL: cluster.name, PART_LABEL: part}


def _service(
    cluster: Cluster, name: str, part: str, ports: list[tuple[str, int]], headless: bool = False
) -> Manifest:
    spec: Manifest = {
        "selector": _labels(cluster, part),
        "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports],
    }
    if headless:
        spec |= {"clusterIP": "None", "publishNotReadyAddresses": True}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": _labels(cluster, part)},
        "spec": spec,
    }


def _ffn_ports(deployment: Deployment) -> list[tuple[str, int]]:
    tp, base = deployment.tensor_parallel_size, deployment.ffn_engines[0].config.port
    ports = [
        (f"rdv-{k}-{t}", group_port(base, k, t, tp))
        for k in range(len(deployment.ffn_engines))
        for t in range(tp)
    ]
    return [*ports, ("api", deployment.ffn_engines[0].api_port)]


def _ffn_service(deployment: Deployment, cluster: Cluster, name: str) -> Manifest:
    return _service(cluster, name, "ffn", _ffn_ports(deployment), headless=True)


def _ffn_statefulset(
    deployment: Deployment, cluster: Cluster, name: str, hosts: list[str]
) -> Manifest:
    # every FFN pod serves its API on the first FFN engine's port: pods have addresses of
    # their own
    return _statefulset(
        deployment,
        cluster,
        name,
        name,
        deployment.ffn_engines[0],
        hosts,
        replicas=len(deployment.ffn_engines),
        ordinal_rank=True,
    )


def _statefulset(
    deployment: Deployment,
    cluster: Cluster,
    name: str,
    service: str,
    engine: Engine,
    hosts: list[str],
    *,
    replicas: int,
    ordinal_rank: bool = False,
) -> Manifest:
    part = "ffn" if engine.role is Role.FFN else engine.name
    placed = _in_pod(engine, hosts)
    command = engine_command(deployment, placed)
    argv = list(command.argv)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in command.env.items()]
    if ordinal_rank:
        # the FFN rank is the pod's ordinal, the end of its host name: a two-line shell puts it
        # into the AFD section; the rest of the section comes verbatim from the environment
        at = argv.index("--additional-config")
        del argv[at : at + 2]
        settings = {k: v for k, v in placed.afd.items() if k != "rank_offset"}
        env.append({"name": "AFD_SETTINGS", "value": json.dumps(settings, sort_keys=True)[1:-1]})
        script = (
            'exec "$@" --additional-config '
            '"{\\"afd\\": {\\"rank_offset\\": ${HOSTNAME##*-}, $AFD_SETTINGS}}"'
        )
        argv = ["sh", "-c", script, "--", *argv]
    env.append({"name": "PROMETHEUS_MULTIPROC_DIR", "value": PROMETHEUS_DIR})
    if cluster.secret is not None:
        env.append(
            {
                "name": "AFD_AUTH_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": cluster.secret, "key": SECRET_KEY}},
            }
        )
    container = {
        "name": "vllm",
        "image": cluster.image,
        "command": argv,
        "env": env,
        "ports": [{"name": "api", "containerPort": engine.api_port}],
        "startupProbe": _health_probe(engine.api_port, period_s=10, failures=180),
        "readinessProbe": _health_probe(engine.api_port, period_s=10, failures=3),
        "livenessProbe": _health_probe(engine.api_port, period_s=30, failures=3),
        "resources": _resources(cluster.resources[engine.role]),
        "volumeMounts": [
            {"name": "model", "mountPath": cluster.model_mount, "readOnly": True},
            {"name": "prometheus", "mountPath": PROMETHEUS_DIR},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    # a fresh dict wherever labels go: YAML would write a shared one as an anchor and aliases
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": _labels(cluster, part)},
        "spec": {
            "serviceName": service,
            "replicas": replicas,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": _labels(cluster, part)},
            "template": {
                "metadata": {
                    "labels": _labels(cluster, part),
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(engine.api_port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "model",
                            "persistentVolumeClaim": {
                                "claimName": cluster.model_claim,
                                "readOnly": True,
                            },
                        },
                        {"name": "prometheus", "emptyDir": {}},
                        {"name": "shm", "emptyDir": {"medium": "Memory"}},
                    ],
                },
            },
        },
    }


def _health_probe(port: int, *, period_s: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": "/health", "port": port},
        "periodSeconds": period_s,
        "failureThreshold": failures,
    }


def _resources(requests: Mapping[str, str]) -> Manifest:
    """The role's requests; extended resources (a device plugin's, such as ``nvidia.com/gpu``)
    also as limits, which Kubernetes requires of them (they cannot be overcommitted)."""
    extended = {name: value for name, value in requests.items() if "/" in name}
    return {"requests": dict(requests), **({"limits": extended} if extended else {})}


def _in_pod(engine: Engine, hosts: list[str]) -> Engine:
    """``engine`` as it runs in its pod: its API on every interface, its group's rendezvous at
    the FFN ranks' stable names."""
    return replace(
        engine,
        host="0.0.0.0",
        binding=None,
        afd={**engine.afd, "ffn_hosts": hosts},
        config=replace(engine.config, ffn_hosts=tuple(hosts)),
    )


def reference_errors(objects: list[Manifest]) -> list[str]:
    """What in ``objects`` refers to nothing: a Service selecting no pod template, a Service
    port no selected container serves (the FFN's rendezvous ports excepted: its engine opens
    them itself), a StatefulSet whose Service is missing, an ``ffn_hosts`` entry naming no pod of
    a headless Service. ``deploy k8s`` checks its own output with it; CI checks the examples."""
    services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
    sets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}
    errors = []
    for name, service in services.items():
        selector = service["spec"]["selector"]
        selected = [
            s
            for s in sets.values()
            if selector.items() <= s["spec"]["template"]["metadata"]["labels"].items()
        ]
        if not selected:
            errors.append(f"Service {name} selects no pod template (selector {selector})")
            continue
        served = {
            p["containerPort"]
            for s in selected
            for c in s["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            if port["name"] == "api" and port["targetPort"] not in served:
                errors.append(f"Service {name} port {port['targetPort']} is served by no container")
    for name, workload in sets.items():
        service = workload["spec"]["serviceName"]
        if service not in services:
            errors.append(f"StatefulSet {name} names Service {service}, which is not rendered")
        for host in _ffn_hosts(workload):
            pod, _, domain = host.partition(".")
            owner = sets.get(pod.rsplit("-", 1)[0])
            headless = services.get(domain, {}).get("spec", {}).get("clusterIP") == "None"
            if (
                owner is None
                or owner["spec"]["serviceName"] != domain
                or not headless
                or not 0 <= int(pod.rsplit("-", 1)[1]) < owner["spec"]["replicas"]
            ):
                errors.append(f"StatefulSet {name}: ffn_hosts entry {host} names no FFN pod")
    return errors


def _ffn_hosts(workload: Manifest) -> list[str]:
    """The ``ffn_hosts`` a workload's engine is started with."""
    container = workload["spec"]["template"]["spec"]["containers"][0]
    settings = {e["name"]: e.get("value") for e in container["env"]}.get("AFD_SETTINGS")
    if settings is not None:  # the FFN ranks' section, from the environment
        return list(json.loads("{" + settings + "}").get("ffn_hosts", []))
    argv = container["command"]
    section = json.loads(argv[argv.index("--additional-config") + 1])["afd"]
    return list(section.get("ffn_hosts", []))
