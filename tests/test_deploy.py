"""The deployment files say what docs/operations.md says: every replica on the one store, ready
only while it answers (/readyz), with one key for the fleet's tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _env(container: dict[str, Any]) -> set[str]:
    return {entry["name"] for entry in container.get("env", [])}


def test_the_kubernetes_fleet_runs_replicas_on_one_store_ready_only_while_it_answers() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes-fleet.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (service,) = [d for d in docs if d["kind"] == "Service"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]

    assert deployment["spec"]["replicas"] > 1
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"CTXPROXY_STORE_URL", "CTXPROXY_CORE_TOKEN", "CTXPROXY_CLIENT_KEYS",
            "CTXPROXY_UPSTREAM_API_KEY"} <= _env(container)


def test_the_sidecar_probes_readiness_inside_its_pod() -> None:
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes.yaml").read_text()))
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (proxy,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
                if c["name"] == "ctxproxy"]
    assert "/readyz" in " ".join(proxy["readinessProbe"]["exec"]["command"])


def test_compose_balances_replicas_that_share_the_store_and_a_key() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    proxy, balancer = compose["services"]["ctxproxy"], compose["services"]["balancer"]

    assert proxy["deploy"]["replicas"] > 1
    assert "ports" not in proxy  # reached through the balancer only
    assert proxy["environment"]["CTXPROXY_STORE_URL"].startswith("postgresql://")
    assert "CTXPROXY_CORE_TOKEN" in proxy["environment"]
    assert "/readyz" in " ".join(proxy["healthcheck"]["test"])
    (mount,) = balancer["volumes"]
    conf = (DEPLOY / mount.split(":")[0]).read_text()
    assert "proxy_pass http://ctxproxy;" in conf
    assert "proxy_buffering off;" in conf  # answers stream through as they arrive
