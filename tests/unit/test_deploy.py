"""deploy/ stays consistent with Relay: every image pinned, ports and probes where Relay's settings and routes put
them, no secret written into a file, timeouts above the executors' ping wait, and the HAProxy configuration accepted
by Debian's haproxy (tests/e2e/test_haproxy.py runs it). The files are parsed, not deployed."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]

from api.app import create_app
from core import metrics
from core.names import APP_PATTERN, ORG_PATTERN
from core.settings import Settings
from tests.support import starts_processes

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"
# An example for executors (KEDA's CRDs), not part of the base: kustomization.yaml leaves it out.
KEDA = DEPLOY / "kubernetes" / "keda-scaledobject.yaml"
HAPROXY = Path("/usr/sbin/haproxy")
RELAY_IMAGE = "ghcr.io/relay-dev/relay"
PING_WAIT = Settings().executor_ping_wait
IMAGE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/-]*)(?::(?P<tag>[\w][\w.-]*))?(?:@sha256:(?P<digest>[0-9a-f]{64}))?$")
# A value that looks like a secret: a key (dbos_...), a password in a URL, or a PEM block.
SECRET_VALUE = re.compile(r"dbos_[A-Za-z0-9_-]{16,}|://[^/\s:@$]+:(?!\$\{)[^@\s]+@|-----BEGIN ")
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|PWD|SECRET|TOKEN|API_KEY|DATABASE_URL", re.IGNORECASE)
DURATION = re.compile(r"^(\d+)(us|ms|s|m|h|d)?$")
UNITS = {"us": timedelta(microseconds=1), "ms": timedelta(milliseconds=1), "s": timedelta(seconds=1),
         "m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return parsed


@pytest.fixture(scope="module")
def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")) if path.name != "kustomization.yaml"
            for doc in documents(path)]


def of_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    pod = manifest["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def relay_containers(manifests: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for m in manifests:
        if m["kind"] in ("Deployment", "Job"):
            for c in containers(m):
                if c["image"].startswith(RELAY_IMAGE):
                    yield m, c


def container_env(manifests: list[dict[str, Any]], container: dict[str, Any]) -> dict[str, Any]:
    """The container's environment: its ConfigMaps' data, then its own ``env`` (values or their ``valueFrom``)."""
    maps = {m["metadata"]["name"]: m["data"] for m in of_kind(manifests, "ConfigMap")}
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        env[item["name"]] = item.get("value", item.get("valueFrom"))
    return env


def settings_of(env: dict[str, Any]) -> Settings:
    """Relay's settings as a container with this environment reads them (plain values only)."""
    fields = {name: value for key, value in env.items() if isinstance(value, str) and key.startswith("RELAY_")
              and (name := key.removeprefix("RELAY_").lower()) in Settings.model_fields}
    return Settings.model_validate(fields)


def drain() -> timedelta:
    """The gateway's drain on SIGTERM, at its default: the settings field that names it."""
    fields = [name for name in Settings.model_fields if "drain" in name]
    if not fields:
        pytest.skip("Relay has no drain setting yet")
    assert len(fields) == 1, fields
    seconds = Settings().model_dump()[fields[0]]
    return timedelta(seconds=seconds or 0)


def images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("image", "newName") and isinstance(value, str):
                yield value
            else:
                yield from images(value)
    elif isinstance(node, list):
        for item in node:
            yield from images(item)


def routes() -> set[str]:
    return set(create_app(Settings()).openapi()["paths"])


def strings(node: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """Every (key, scalar) pair in a parsed document, the scalar as text."""
    if isinstance(node, dict):
        for k, value in node.items():
            yield from strings(value, str(k))
    elif isinstance(node, list):
        for item in node:
            yield from strings(item, key)
    elif node is not None:
        yield key, str(node)


def haproxy_duration(text: str) -> timedelta:
    match = DURATION.match(text)
    assert match, text
    return int(match.group(1)) * UNITS[match.group(2) or "ms"]


def haproxy_timeouts() -> dict[str, timedelta]:
    found = re.findall(r"^\s*timeout\s+(\S+)\s+(\S+)", HAPROXY_CFG.read_text(), re.MULTILINE)
    return {name: haproxy_duration(value) for name, value in found}


# -- every YAML file --------------------------------------------------------------------------------------------


def test_every_yaml_file_parses() -> None:
    assert {p.relative_to(DEPLOY).parts[0] for p in yaml_files()} >= {"compose", "kubernetes", "prometheus", "grafana"}
    for path in yaml_files():
        assert documents(path), path


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_image_is_pinned(path: Path) -> None:
    for doc in documents(path):
        for image in images(doc):
            match = IMAGE.match(image)
            assert match, image
            assert match["tag"] or match["digest"], f"{path}: {image} is not pinned"
            assert match["tag"] != "latest", f"{path}: {image}"
            # A moving tag (postgres:16) pins nothing: an exact version, or a digest beside it.
            assert match["digest"] or re.search(r"\d+\.\d+\.\d+", match["tag"] or ""), f"{path}: {image}"


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_no_secret_is_written_in_a_file(path: Path) -> None:
    for doc in documents(path):
        for key, value in strings(doc):
            assert not SECRET_VALUE.search(value), f"{path}: {key}={value}"
            if key.isupper() and SECRET_NAME.search(key) and value:
                # An environment variable (compose): only ${VAR} from the env file, inside a URL too.
                assert "${" in value, f"{path}: {key}"


def test_env_example_names_every_variable_without_a_value() -> None:
    example = (DEPLOY / "compose" / ".env.example").read_text()
    names = dict(line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#"))
    assert set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text())) == set(names)
    assert all(value == "" for value in names.values()), names


# -- compose ----------------------------------------------------------------------------------------------------


def test_compose_topology(compose: dict[str, Any]) -> None:
    services = compose["services"]
    commands = {name: s.get("command") for name, s in services.items() if s["image"].startswith(RELAY_IMAGE)}
    assert sorted(name for name, c in commands.items() if c == ["gateway"]) == ["gateway-1", "gateway-2"]
    assert sorted(name for name, c in commands.items() if c == ["worker"]) == ["worker-1", "worker-2"]
    assert commands["relay-migrate"] == ["migrate"] and commands["relay-temporal-setup"] == ["temporal", "setup"]
    for name in ("gateway-1", "gateway-2", "worker-1", "worker-2"):
        after = services[name]["depends_on"]
        assert after["relay-migrate"]["condition"] == "service_completed_successfully"
        assert after["relay-temporal-setup"]["condition"] == "service_completed_successfully"
    assert {"temporal", "temporal-ui", "temporal-postgresql", "relay-postgresql", "haproxy", "prometheus",
            "grafana"} <= set(services)


def test_compose_ports_agree_with_haproxy_and_prometheus(compose: dict[str, Any]) -> None:
    services = compose["services"]
    cfg = HAPROXY_CFG.read_text()
    scraped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in scraped["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    for name, service in services.items():
        if service.get("command") not in (["gateway"], ["worker"]):
            continue
        settings = settings_of(service["environment"])
        assert settings.metrics_host == "0.0.0.0"
        assert f"{name}:{settings.metrics_port}" in targets
        assert f"{name}:{settings.temporal_metrics_address.rsplit(':', 1)[1]}" in targets  # type: ignore[union-attr]
        if service["command"] == ["gateway"]:
            assert settings.host == "0.0.0.0"
            assert f"{name}:{settings.port}" in cfg  # the load balancer's default address for it
            assert settings.gateway_id == name
    assert "haproxy:8405" in targets and '"${LB_METRICS_BIND-:8405}"' in cfg


def test_compose_migrates_in_its_one_shot_only(compose: dict[str, Any]) -> None:
    """Gateways and workers run no DDL at start (RELAY_MIGRATE_ON_START=false): `relay migrate` does, once, before
    any of them starts."""
    services = compose["services"]
    servers = [name for name, s in services.items() if s.get("command") in (["gateway"], ["worker"])]
    assert len(servers) == 4
    for name in servers:
        assert settings_of(services[name]["environment"]).migrate_on_start is False, name
        assert services[name]["depends_on"]["relay-migrate"]["condition"] == "service_completed_successfully"
    assert services["relay-migrate"]["command"] == ["migrate"]
    assert services["relay-migrate"]["restart"] == "no"


def test_compose_stops_gateways_after_their_drain(compose: dict[str, Any]) -> None:
    for name in ("gateway-1", "gateway-2"):
        assert haproxy_duration(compose["services"][name]["stop_grace_period"]) > drain()


def test_grafana_provisions_the_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"] if v.startswith("../"))
    provisioning = DEPLOY / "grafana" / "provisioning"
    assert mounts["../grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load((provisioning / "dashboards" / "relay.yaml").read_text())["providers"][0]
    assert mounts["../grafana/relay.json"].startswith(provider["options"]["path"] + "/")
    assert (COMPOSE.parent / "../grafana/relay.json").resolve().is_file()
    datasource = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"


# -- kubernetes -------------------------------------------------------------------------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    files = {p.name for p in (DEPLOY / "kubernetes").glob("*.yaml")} - {"kustomization.yaml", KEDA.name}
    assert set(kustomization["resources"]) == files


def test_the_keda_example_scales_an_executor_deployment_on_the_desired_executors_gauge() -> None:
    """The ScaledObject's query names the gauge Relay exports, with exactly its labels, aggregated with ``max`` over
    the gateways; one replica per unit of it; the base leaves it out (it needs KEDA's CRDs)."""
    [scaled] = documents(KEDA)
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment") and target["name"]
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    [trigger] = scaled["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    meta = trigger["metadata"]
    assert float(meta["threshold"]) == 1 and meta["ignoreNullValues"] == "true"
    assert meta["serverAddress"].startswith("http")
    found = re.fullmatch(r'max\((?P<name>[a-z_]+)\{(?P<labels>[^}]*)\}\)', meta["query"])
    assert found, meta["query"]
    assert found["name"] == metrics.DESIRED_EXECUTORS.NAME and found["name"] in metrics.exported_names()
    labels = dict(re.findall(r'(\w+)="([^"]*)"', found["labels"]))
    [family] = metrics.DESIRED_EXECUTORS.describe()
    gauge_labels = {"org", "app", "version"}
    metrics.DESIRED_EXECUTORS.put("test_org", "test-app", {"v9": 2})
    try:
        [sample] = [s for f in metrics.DESIRED_EXECUTORS.collect() for s in f.samples
                    if s.labels.get("app") == "test-app"]
    finally:
        metrics.DESIRED_EXECUTORS.remove("test_org", "test-app")
    assert family.type == "gauge" and set(sample.labels) == gauge_labels == set(labels), (sample, labels)
    assert re.fullmatch(APP_PATTERN, labels["app"]) and re.fullmatch(ORG_PATTERN, labels["org"])
    kustomization = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    assert KEDA.name not in kustomization["resources"]


def test_kubernetes_objects(manifests: list[dict[str, Any]]) -> None:
    deployments = {m["metadata"]["name"]: m for m in of_kind(manifests, "Deployment")}
    assert deployments["relay-gateway"]["spec"]["replicas"] == 2
    assert [c["args"] for c in containers(deployments["relay-worker"])] == [["worker"]]
    job = of_kind(manifests, "Job")[0]
    assert [c["args"] for c in containers(job)] == [["migrate"], ["temporal", "setup"]]  # init container first
    assert of_kind(manifests, "PodDisruptionBudget") and of_kind(manifests, "Service")
    assert not of_kind(manifests, "Secret")
    for service in of_kind(manifests, "Service"):
        assert "sessionAffinity" not in service["spec"] or service["spec"]["sessionAffinity"] == "None"


def test_kubernetes_migrates_in_its_job_only(manifests: list[dict[str, Any]]) -> None:
    """The Deployments' containers run no DDL at start (RELAY_MIGRATE_ON_START=false); the Job's first step is
    `relay migrate` (which migrates whatever that setting says), on the same database."""
    deployments = of_kind(manifests, "Deployment")
    assert {m["metadata"]["name"] for m in deployments} == {"relay-gateway", "relay-worker"}
    for deployment in deployments:
        for container in containers(deployment):
            assert settings_of(container_env(manifests, container)).migrate_on_start is False, container["name"]
    job = of_kind(manifests, "Job")[0]
    (migrate,) = job["spec"]["template"]["spec"]["initContainers"]
    assert migrate["args"] == ["migrate"]
    gateway = next(m for m in deployments if m["metadata"]["name"] == "relay-gateway")
    assert container_env(manifests, migrate)["RELAY_DATABASE_URL"] == \
        container_env(manifests, containers(gateway)[0])["RELAY_DATABASE_URL"]


def test_gateway_ports_and_probes_agree_with_relay(manifests: list[dict[str, Any]]) -> None:
    gateway = next(m for m in of_kind(manifests, "Deployment") if m["metadata"]["name"] == "relay-gateway")
    (container,) = containers(gateway)
    settings = settings_of(container_env(manifests, container))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["http"] == settings.port and settings.host == "0.0.0.0"
    assert ports["metrics"] == settings.metrics_port and settings.metrics_host == "0.0.0.0"
    assert f"{settings.metrics_host}:{ports['temporal-metrics']}" == settings.temporal_metrics_address
    known = routes()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["path"] in known
        assert container[probe]["httpGet"]["port"] == "http"
    service = next(s for s in of_kind(manifests, "Service") if s["metadata"]["name"] == "relay-gateway")
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    annotations = gateway["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == settings.metrics_port


def test_gateways_are_given_longer_than_their_drain(manifests: list[dict[str, Any]]) -> None:
    gateway = next(m for m in of_kind(manifests, "Deployment") if m["metadata"]["name"] == "relay-gateway")
    assert timedelta(seconds=gateway["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]) > drain()


def test_relay_containers_are_locked_down(manifests: list[dict[str, Any]]) -> None:
    found = list(relay_containers(manifests))
    assert len(found) == 4  # gateway, worker, the Job's two steps
    for manifest, container in found:
        pod = manifest["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["resources"]["requests"]
        env = container_env(manifests, container)
        # The data dir (gateway lock files) on an emptyDir: the root filesystem is read-only.
        mounts = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert "emptyDir" in volumes[mounts[env["RELAY_DATA_DIR"]]]
        for key, value in env.items():
            if SECRET_NAME.search(key):
                assert isinstance(value, dict) and "secretKeyRef" in value, key


def test_ingress_keeps_websockets_open_and_their_paths_out_of_the_log(manifests: list[dict[str, Any]]) -> None:
    ingresses = {m["metadata"]["name"]: m for m in of_kind(manifests, "Ingress")}
    for ingress in ingresses.values():
        annotations = ingress["metadata"]["annotations"]
        for timeout in ("proxy-read-timeout", "proxy-send-timeout"):
            assert timedelta(seconds=int(annotations[f"nginx.ingress.kubernetes.io/{timeout}"])) > PING_WAIT
        assert not any("affinity" in key for key in annotations)
    sockets = ingresses["relay-websocket"]
    assert sockets["metadata"]["annotations"]["nginx.ingress.kubernetes.io/enable-access-log"] == "false"
    paths = [p["path"] for rule in sockets["spec"]["rules"] for p in rule["http"]["paths"]]
    assert paths == ["/websocket"]


# -- haproxy ----------------------------------------------------------------------------------------------------


def test_haproxy_timeouts_are_above_the_ping_wait() -> None:
    timeouts = haproxy_timeouts()
    for name in ("tunnel", "client", "server"):
        assert timeouts[name] > PING_WAIT, name


def test_haproxy_checks_readiness_without_stickiness() -> None:
    cfg = HAPROXY_CFG.read_text()
    check = re.search(r"http-check send meth GET uri (\S+)", cfg)
    assert check and check.group(1) == "/readyz" and check.group(1) in routes()
    assert not re.search(r"^\s*(cookie|stick|stick-table|balance\s+source|hash-type)\b", cfg, re.MULTILINE)
    # The log format names no request line or URI: only the path variable with /websocket/ paths cut.
    log_format = re.search(r'^\s*log-format\s+"(.*)"\s*$', cfg, re.MULTILINE)
    assert log_format and not re.search(r"%\{[^}]*\}?(r|HU|HP|HQ)\b|%(r|HU|HP|HQ)\b", log_format.group(1))
    assert "http-request set-var(txn.logged_path) str(/websocket/...) if { path_sub -i websocket }" in cfg


def test_haproxy_takes_a_draining_gateway_out_of_rotation_before_its_drain_ends() -> None:
    """A gateway on SIGTERM fails its checks at once; after ``fall`` failed checks ``inter`` apart (the first one up
    to ``inter`` late), HAProxy stops sending it executors: that must come before the drain closes their sockets,
    or they would reconnect to the gateway that is going away."""
    found = re.search(r"^\s*default-server\s+check\s+inter\s+(\S+)\s+fall\s+(\d+)", HAPROXY_CFG.read_text(),
                      re.MULTILINE)
    assert found, "default-server check inter <time> fall <n>"
    assert haproxy_duration(found.group(1)) * int(found.group(2)) < drain()


@starts_processes
def test_haproxy_accepts_the_configuration(tmp_path: Path) -> None:
    if not HAPROXY.exists():
        pytest.skip("Debian's haproxy is not installed (make test installs it)")
    env = {**os.environ, "LB_BIND": "127.0.0.1:18080", "LB_METRICS_BIND": "127.0.0.1:18405",
           "GATEWAY_1": "127.0.0.1:18091", "GATEWAY_2": "127.0.0.1:18092"}
    done = subprocess.run([str(HAPROXY), "-c", "-f", str(HAPROXY_CFG)], env=env, capture_output=True, text=True,
                          timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Configuration file is valid" in done.stdout + done.stderr
    assert "WARNING" not in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_worker_readiness_probe_is_its_metrics_listeners_readyz(manifests: list[dict[str, Any]]) -> None:
    worker = next(m for m in of_kind(manifests, "Deployment") if m["metadata"]["name"] == "relay-worker")
    (container,) = containers(worker)
    settings = settings_of(container_env(manifests, container))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == settings.metrics_port and settings.metrics_host == "0.0.0.0"
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/readyz", "metrics")
    assert "livenessProbe" not in container  # a worker away from Temporal retries; it is not restarted for it

    # The listener answers that path as a probe (not with metrics text): 503 with the reason while not ready.
    served: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        served.append(status)
        return lambda data: None

    app = metrics.with_probes(lambda environ, start: [b"metrics"], lambda: "draining")
    body = b"".join(app({"PATH_INFO": probe["path"]}, start_response))
    assert served == ["503 Service Unavailable"] and b"draining" in body
