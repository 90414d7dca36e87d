"""deploy/kubernetes: every manifest valid against the Kubernetes API schemas, every command one our CLIs accept.

kubernetes-validate ships the API's JSON schemas, so this runs offline; ``strict`` also refuses
fields the schema does not know (a misspelt key would otherwise be dropped silently by the API
server). The kustomization must list every manifest. Each container's command is parsed by our
own console script (tests/support/cli_parse.py), and each role's TOML in the ConfigMap loads with its
role's config model, so a renamed flag or config key fails here instead of in a cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from coordinator.config import CoordinatorConfig
from runtime.config import RoleConfig, load_config
from shardcast.relay.config import RelayConfig
from tests.support.cli_parse import console_scripts, parse_command
from validator.config import ValidatorConfig
from worker.config import WorkerConfig

BASE = Path(__file__).resolve().parents[3] / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.30"
ROLE_CONFIGS: dict[str, type[RoleConfig]] = {
    "coordinator.toml": CoordinatorConfig,
    "relay.toml": RelayConfig,
    "worker.toml": WorkerConfig,
    "validator.toml": ValidatorConfig,
}


def manifests() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        found += [(name, doc) for doc in yaml.safe_load_all((BASE / name).read_text()) if doc is not None]
    return found


def kinds() -> dict[str, dict[str, Any]]:
    return {f"{doc['kind']}/{doc['metadata']['name']}": doc for _, doc in manifests()}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def test_the_kustomization_lists_every_manifest() -> None:
    listed = set(yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"])
    assert listed == {path.name for path in BASE.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize(("name", "doc"), manifests(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_each_manifest_validates_against_the_api_schema(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_schema_error_is_caught() -> None:
    broken = kinds()["Deployment/prime-relay"]
    broken = {**broken, "spec": {**broken["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_every_role_runs_with_probes_volumes_and_gpus_where_needed() -> None:
    found = kinds()
    expected = {
        "StatefulSet/prime-coordinator",
        "Deployment/prime-relay",
        "StatefulSet/prime-worker",
        "Deployment/prime-validator",
        "StatefulSet/prime-postgres",
        "Service/prime-coordinator",
        "Service/prime-relay",
        "ConfigMap/prime-config",
    }
    assert expected <= set(found)
    assert found["StatefulSet/prime-coordinator"]["spec"]["volumeClaimTemplates"]
    for name in ("StatefulSet/prime-coordinator", "Deployment/prime-relay"):  # the roles that serve /healthz
        (container,) = containers(found[name])
        for probe in ("readinessProbe", "livenessProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz", (name, probe)
    (worker,) = containers(found["StatefulSet/prime-worker"])
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    for name in ("StatefulSet/prime-coordinator", "Deployment/prime-relay", "Deployment/prime-validator"):
        for container in containers(found[name]):
            assert "nvidia.com/gpu" not in container.get("resources", {}).get("limits", {}), name
            assert container["image"] == "prime-network", f"{name} runs the GPU image without a GPU"
    secrets = {
        volume["secret"]["secretName"]
        for doc in found.values()
        if doc["kind"] in {"StatefulSet", "Deployment"}
        for volume in doc["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in volume
    }
    assert secrets == {"prime-coordinator-key", "prime-validator-key"}


def test_every_command_parses_with_our_cli_and_every_config_loads(tmp_path: Path) -> None:
    configs = kinds()["ConfigMap/prime-config"]["data"]
    assert set(configs) == set(ROLE_CONFIGS)
    commands = [
        container["command"]
        for doc in kinds().values()
        if doc["kind"] in {"StatefulSet", "Deployment"}
        for container in containers(doc)
        if container.get("command", [""])[0].startswith("prime-")
    ]
    assert {argv[0] for argv in commands} == set(console_scripts()) - {"prime-trainer"}
    for argv in commands:
        config_path = parse_command(argv).params.get("config")
        assert config_path is not None and config_path.parent == Path("/etc/prime"), argv
        assert config_path.name in configs, f"{argv}: the ConfigMap has no {config_path.name}"
    for name, model in ROLE_CONFIGS.items():
        path = tmp_path / name
        path.write_text(configs[name])
        loaded = load_config(model, path, {})
        assert str(getattr(loaded, "data_dir", "")).startswith("/data/"), name  # on the pod's volume, not the image


def env_from_config_map(doc: dict[str, Any], variable: str) -> tuple[str, str]:
    (container,) = containers(doc)
    (entry,) = [env for env in container.get("env", []) if env["name"] == variable]
    ref = entry["valueFrom"]["configMapKeyRef"]
    return ref["name"], ref["key"]


def test_the_base_trains_and_its_ids_come_from_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented commands, run for real, write the ids; the workloads read them through prime-ids."""
    import subprocess
    import sys

    found = kinds()
    coordinator_toml = tmp_path / "coordinator.toml"
    coordinator_toml.write_text(found["ConfigMap/prime-config"]["data"]["coordinator.toml"])
    assert load_config(CoordinatorConfig, coordinator_toml, {}).orchestrator.enabled, "the base must train"
    generator = yaml.safe_load((BASE / "kustomization.yaml").read_text())["configMapGenerator"]
    (ids,) = [entry for entry in generator if entry["name"] == "prime-ids"]
    files = dict(item.split("=", 1) for item in ids["files"])
    assert env_from_config_map(found["Deployment/prime-relay"], "PRIME_RELAY_COORDINATOR_ID") == (
        "prime-ids",
        "coordinator-id",
    )
    variable = "PRIME_COORDINATOR_TRUST__APPROVED_VALIDATORS"
    assert env_from_config_map(found["StatefulSet/prime-coordinator"], variable) == ("prime-ids", "approved-validators")

    bin_dir = Path(sys.executable).parent
    for script, key_dir in (("prime-coordinator", "coordinator"), ("prime-validator", "validator")):
        subprocess.run([bin_dir / script, "keys", "create", "--data-dir", tmp_path / key_dir], check=True)
    (tmp_path / "ids").mkdir()
    shown = "keys show --data-dir {}/{} --id-only"
    commands = [
        f"{bin_dir}/prime-coordinator {shown.format(tmp_path, 'coordinator')} > {tmp_path}/{files['coordinator-id']}",
        f'printf \'["%s"]\' "$({bin_dir}/prime-validator {shown.format(tmp_path, "validator")})" '
        f"> {tmp_path}/{files['approved-validators']}",
    ]
    for command in commands:
        subprocess.run(["sh", "-c", command], check=True)
    coordinator_id = (tmp_path / files["coordinator-id"]).read_text().strip()
    monkeypatch.setenv(variable, (tmp_path / files["approved-validators"]).read_text())
    config = load_config(CoordinatorConfig, coordinator_toml, {})
    assert len(config.trust.approved_validators) == 1 and config.trust.approved_validators[0].startswith("12D3KooW")
    relay_toml = tmp_path / "relay.toml"
    relay_toml.write_text(found["ConfigMap/prime-config"]["data"]["relay.toml"])
    monkeypatch.setenv("PRIME_RELAY_COORDINATOR_ID", coordinator_id)
    assert load_config(RelayConfig, relay_toml, {}).coordinator_id == coordinator_id
