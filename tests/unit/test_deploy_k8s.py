"""Kubernetes manifests of deployment specs (afd_models.deploy.k8s): 1A1F, 3A2F and TP 2, each
object valid against the Kubernetes schema (kubernetes-validate, strict), their cross-references
intact (and each kind of broken one caught), and a spec they cannot follow refused by name."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest

from afd_models.deploy.k8s import manifests, reference_errors
from afd_models.deploy.spec import SpecError, load_spec, parse_spec

#: the Kubernetes release the manifests are validated against (noxfile.py pins its schemas)
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
KUBERNETES = KUBERNETES_VALIDATE.split("==")[1]
#: the Kubernetes example of docs/deployment.md
GUIDE_SPEC = Path(__file__).resolve().parents[2] / "docs" / "deploy" / "k8s-3a2f.toml"
CLUSTER = {
    "name": "demo",
    "image": "vllm-afd:0.1",
    "model_claim": "models",
    "secret": "demo-afd-token",
    "attention_resources": {"cpu": "8", "memory": "32Gi"},
    "ffn_resources": {"cpu": "8", "memory": "64Gi"},
}
SPECS: dict[str, dict[str, Any]] = {
    "1A1F": {"attention": {}, "ffn": {}},
    "3A2F": {"attention": {"engines": [2, 1]}, "ffn": {"ranks": 2}},
    "TP2": {"tensor_parallel_size": 2, "attention": {}, "ffn": {}},
}


def _objects(name: str) -> list[dict[str, Any]]:
    data = {"model": "/models/m", **SPECS[name], "kubernetes": CLUSTER}
    return manifests(parse_spec(data))


def _kubernetes_validate() -> Any:
    """kubernetes-validate, which `nox -s manifests` installs (`nox -s tests` runs it, and says
    it is required there); the CPU envs go without it."""
    try:
        import kubernetes_validate
    except ImportError:
        if os.environ.get("AFD_KUBERNETES_SCHEMA") == "required":
            raise
        pytest.skip(f"{KUBERNETES_VALIDATE} is not installed: `nox -s manifests` runs this test")
    return kubernetes_validate


@pytest.mark.parametrize("name", [*SPECS, GUIDE_SPEC.name])
def test_manifests_are_valid_kubernetes_objects(name: str) -> None:
    validate = _kubernetes_validate()
    objects = manifests(load_spec(GUIDE_SPEC)) if name == GUIDE_SPEC.name else _objects(name)
    assert reference_errors(objects) == []
    for manifest in objects:
        validate.validate(manifest, KUBERNETES, strict=True)


@pytest.mark.parametrize("name", SPECS)
def test_manifests_refer_to_each_other(name: str) -> None:
    objects = _objects(name)
    assert reference_errors(objects) == []
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds[:2] == [("Service", "demo-ffn"), ("StatefulSet", "demo-ffn")]
    ffn = objects[1]
    assert ffn["spec"]["replicas"] == SPECS[name]["ffn"].get("ranks", 1)
    settings = {e["name"]: e.get("value") for e in _container(ffn)["env"]}
    section = json.loads("{" + settings["AFD_SETTINGS"] + "}")
    assert section["ffn_hosts"] == [
        f"demo-ffn-{k}.demo-ffn" for k in range(ffn["spec"]["replicas"])
    ]
    assert "rank_offset" not in section  # the pod's ordinal
    headless = objects[0]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    tp = SPECS[name].get("tensor_parallel_size", 1)
    rendezvous = [p["port"] for p in headless["ports"] if p["name"].startswith("rdv-")]
    assert rendezvous == list(range(29650, 29650 + ffn["spec"]["replicas"] * tp))


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = workload["spec"]["template"]["spec"]["containers"][0]
    return container


def test_a_broken_reference_is_caught() -> None:
    objects = _objects("3A2F")
    selector = copy.deepcopy(objects)
    selector[2]["spec"]["selector"]["afd.vllm.ai/part"] = "nobody"
    assert reference_errors(selector) == [
        "Service demo-attention0 selects no pod template (selector "
        "{'app.kubernetes.io/instance': 'demo', 'afd.vllm.ai/part': 'nobody'})"
    ]
    port = copy.deepcopy(objects)
    port[2]["spec"]["ports"][0]["targetPort"] = 9999
    assert reference_errors(port) == ["Service demo-attention0 port 9999 is served by no container"]
    service = copy.deepcopy(objects)
    service[1]["spec"]["serviceName"] = "elsewhere"
    assert "StatefulSet demo-ffn names Service elsewhere, which is not rendered" in (
        reference_errors(service)
    )
    hosts = copy.deepcopy(objects)
    argv = _container(hosts[3])["command"]
    at = argv.index("--additional-config") + 1
    section = json.loads(argv[at])
    section["afd"]["ffn_hosts"][1] = "demo-ffn-2.demo-ffn"
    argv[at] = json.dumps(section)
    assert reference_errors(hosts) == [
        "StatefulSet demo-attention0: ffn_hosts entry demo-ffn-2.demo-ffn names no FFN pod"
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kubernetes": None}, "a [kubernetes] table is required"),
        ({"secret": None}, "kubernetes.secret is required: the FFN ranks listen on the cluster"),
        (
            {"model": "/data/m"},
            "model='/data/m' is not allowed with kubernetes.model_mount='/models'",
        ),
        ({"name": "Demo_1"}, "kubernetes.name='Demo_1' is not allowed; allowed: a DNS label"),
        ({"image": None}, "kubernetes.image is required with a [kubernetes] table"),
        ({"ffn_resources": {"cpu": 8}}, "kubernetes.ffn_resources={'cpu': 8} is not allowed"),
    ],
)
def test_a_spec_the_manifests_cannot_follow_is_refused(
    change: dict[str, Any], message: str
) -> None:
    cluster = {k: v for k, v in {**CLUSTER, **change}.items() if v is not None and k != "model"}
    data: dict[str, Any] = {"model": change.get("model", "/models/m"), "attention": {}, "ffn": {}}
    if "kubernetes" not in change:
        data["kubernetes"] = cluster
    with pytest.raises(SpecError) as raised:
        manifests(parse_spec(data))
    assert message in str(raised.value), raised.value


@pytest.mark.parametrize("key", ["allow_unauthenticated", "auth_token_file"])
def test_a_secret_beside_another_source_is_refused(key: str, tmp_path: Path) -> None:
    """The pods' secret comes from the Kubernetes Secret; the workers would refuse a second
    source, or allow_unauthenticated beside it."""
    token = tmp_path / "token"
    token.write_text("s" * 32)
    token.chmod(0o600)
    afd = {key: True if key == "allow_unauthenticated" else str(token)}
    data = {"model": "/models/m", "afd": afd, "attention": {}, "ffn": {}, "kubernetes": CLUSTER}
    with pytest.raises(SpecError, match=f"kubernetes.secret='demo-afd-token' with afd.{key} is"):
        manifests(parse_spec(data))


def test_device_resources_are_also_limits_and_the_yaml_has_no_aliases() -> None:
    """A device plugin's resource must be a limit too, or Kubernetes refuses the pod; shared
    dicts would come out of the YAML writer as anchors and aliases an operator must decode."""
    import yaml

    assert "limits" not in _container(_objects("1A1F")[1])["resources"]  # CPU and memory only
    objects = manifests(load_spec(GUIDE_SPEC))
    for workload in (o for o in objects if o["kind"] == "StatefulSet"):
        resources = _container(workload)["resources"]
        assert resources["limits"] == {"nvidia.com/gpu": resources["requests"]["nvidia.com/gpu"]}
    text = yaml.safe_dump_all(objects, sort_keys=False)
    assert "&id" not in text and "*id" not in text
