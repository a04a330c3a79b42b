"""deploy/ stays true to the service, offline: no Docker engine, no cluster, no network.

Every YAML file under deploy/ parses; every container built from the repo's image runs a real
`queue-service` subcommand with real options; every QUEUE_* variable is a setting of
`queue_service.config` and its value passes that setting's validation; health probes use gRPC
on the listen port; the shutdown budgets (compose stop_grace_period, Kubernetes
terminationGracePeriodSeconds) cover the drain the server actually does; and the Kubernetes
selectors (Deployment, Services, PodDisruptionBudget) pick the replicas' pods and nothing else.
A `serve` container must also pass `Config.require_service_targets` (a database, a core, and
authentication or an explicit QUEUE_ALLOW_UNAUTHENTICATED), find every file setting
(QUEUE_AUTH_FILE, QUEUE_TLS_*) on a Secret it mounts readably, and an unauthenticated stack
may publish ports on loopback only. The replicas' NetworkPolicy opens exactly the gRPC and
metrics ports to named namespaces and lets them reach only DNS, PostgreSQL, the core and the
collector; the manifests turn reflection off. Every host of the Ingress, as `kubectl kustomize`
renders it, passes the replicas' own host check (queue_service/api/listeners/web_hosts.py) with the
ConfigMap's settings, so the console is not refused 421 behind it.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from queue_service import cli
from queue_service.api.listeners.web_hosts import AllowedHosts
from queue_service.config import SETTINGS, Config, ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
COLLECTOR = DEPLOY / "otel-collector.yaml"
K8S = DEPLOY / "k8s"

KNOWN_ENV = {setting.env for setting in SETTINGS.values()}  # includes DATABASE_URL
K8S_API_VERSIONS = {
    "Deployment": "apps/v1",
    "Service": "v1",
    "ConfigMap": "v1",
    "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Namespace": "v1",
    "Ingress": "networking.k8s.io/v1",
}
KUSTOMIZATION = K8S / "kustomization.yaml"
PROBE_KINDS = ("startupProbe", "readinessProbe", "livenessProbe")
# The health service that does not follow the database (queue_service.server.LIVENESS_SERVICE;
# not imported, so these tests load no server).
LIVENESS_SERVICE = "liveness"


# -- reading the repository ------------------------------------------------------------------


@cache
def yaml_documents() -> dict[Path, list[Any]]:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
    return {path: [d for d in yaml.safe_load_all(path.read_text()) if d is not None] for path in files}


@cache
def compose() -> dict[str, Any]:
    """The compose file as compose reads it with no variables set: `${NAME:-default}` and
    `${NAME-default}` become their defaults."""
    text = re.sub(r"\$\{\w+:?-([^}]*)\}", r"\1", COMPOSE.read_text())
    return yaml.safe_load(text)


@cache
def k8s_objects() -> list[dict[str, Any]]:
    """The objects under deploy/k8s (kustomization.yaml is kustomize's input, not an object)."""
    return [doc for path, docs in yaml_documents().items() if K8S in path.parents and path != KUSTOMIZATION for doc in docs]


def k8s_one(kind: str) -> dict[str, Any]:
    found = [o for o in k8s_objects() if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} under deploy/k8s, found {len(found)}"
    return found[0]


class _Captured(Exception):
    pass


@cache
def cli_options() -> dict[str, frozenset[str]]:
    """The subcommands of `queue-service` and each one's option strings, from the real parser."""
    seen: dict[str, argparse.ArgumentParser] = {}

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        seen["parser"] = self
        raise _Captured

    with mock.patch.object(argparse.ArgumentParser, "parse_args", capture):
        with pytest.raises(_Captured):
            cli.main([])
    subparsers = next(a for a in seen["parser"]._actions if isinstance(a, argparse._SubParsersAction))
    return {name: frozenset(p._option_string_actions) for name, p in subparsers.choices.items()}


@cache
def dockerfile() -> dict[str, Any]:
    """ENTRYPOINT, ENV and USER of the Dockerfile's final stage."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    final = re.split(r"^FROM\s", text, flags=re.MULTILINE)[-1]
    entrypoint = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", final, re.MULTILINE)
    user = re.search(r"^USER\s+(\d+)", final, re.MULTILINE)
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV\s+(.*)$", final, re.MULTILINE):
        for token in shlex.split(line):
            name, _, value = token.partition("=")
            env[name] = value
    assert entrypoint and user, "the Dockerfile's final stage needs an ENTRYPOINT and a numeric USER"
    return {"entrypoint": json.loads(entrypoint.group(1)), "env": env, "uid": int(user.group(1))}


def config_of(env: dict[str, str], where: str) -> Config:
    try:
        return Config.from_env(env)
    except ConfigError as exc:
        pytest.fail(f"{where}: {exc}")


def serve_config_of(env: dict[str, str], where: str) -> Config:
    config = config_of(env, where)
    try:
        config.require_service_targets()
    except ConfigError as exc:
        pytest.fail(f"{where}: `serve` would refuse to start: {exc}")
    return config


FILE_SETTINGS = [f for f, s in SETTINGS.items() if s.env.endswith("_FILE")]


def with_stand_in_files(env: dict[str, str], mount_paths: list[str]) -> dict[str, str]:
    """File settings under one of `mount_paths` point at an existing file instead (the mount
    provides it at run time); the others are left for `Config.from_env` to check."""
    env = dict(env)
    for setting in FILE_SETTINGS:
        path = env.get(SETTINGS[setting].env, "")
        if path and any(path.startswith(m.rstrip("/") + "/") for m in mount_paths):
            env[SETTINGS[setting].env] = str(ROOT / "Dockerfile")
    return env


def port_of(host_port: str) -> int:
    return int(host_port.rpartition(":")[2])


def shutdown_budget(config: Config) -> float:
    """What `QueueApp.stop` can take after SIGTERM: the gRPC grace period, then in-flight
    releases (the dispatcher waits QUEUE_CORE_DEADLINE_SECONDS + 1 for them)."""
    return config.grace_period_seconds + config.core_deadline_seconds + 1


def seconds(duration: str | int | float) -> float:
    """A compose (Go-style) duration: `25s`, `1m30s`, `500ms`, or a number of seconds."""
    if isinstance(duration, (int, float)):
        return float(duration)
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration.strip(), f"bad duration {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_argv(argv: list[str], where: str) -> str:
    """Fails unless argv (after the queue-service entrypoint) is a real subcommand with real
    options; returns the subcommand."""
    assert argv, f"{where}: no command"
    if argv[0] == "queue-service":
        argv = argv[1:]
    options = cli_options()
    assert argv and argv[0] in options, f"{where}: {argv[:1]} is not a queue-service subcommand ({sorted(options)})"
    for token in argv[1:]:
        if token.startswith("-"):
            assert token.split("=", 1)[0] in options[argv[0]], f"{where}: `{argv[0]}` has no option {token}"
    assert argv[0] != "dev", f"{where}: `dev` starts an embedded PostgreSQL and is not for deployments"
    return argv[0]


def check_env_names(names: list[str], where: str) -> None:
    unknown = sorted(n for n in names if n not in KNOWN_ENV and not n.startswith("OTEL_"))
    assert unknown == [], f"{where}: not settings of queue_service.config (nor OTEL_*): {unknown}"


# -- compose ---------------------------------------------------------------------------------


def compose_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


@cache
def built_images() -> frozenset[str]:
    """Images of compose services built from the repository's Dockerfile."""
    images = set()
    for name, service in compose()["services"].items():
        build = service.get("build")
        if build is None:
            continue
        context = (DEPLOY / (build if isinstance(build, str) else build.get("context", "."))).resolve()
        dockerfile_path = context / (build.get("dockerfile", "Dockerfile") if isinstance(build, dict) else "Dockerfile")
        if dockerfile_path == ROOT / "deploy" / "postgres" / "Dockerfile":
            continue  # the PostgreSQL image, not the service's
        assert dockerfile_path == ROOT / "Dockerfile", f"compose service {name} builds {dockerfile_path}, not the repo's Dockerfile"
        images.add(service.get("image", name))
    return frozenset(images)


def compose_queue_services() -> dict[str, dict[str, Any]]:
    """Services that run the repository's image, keyed by name."""
    return {n: s for n, s in compose()["services"].items() if s.get("image") in built_images()}


def compose_argv(name: str, service: dict[str, Any]) -> list[str]:
    entrypoint = service.get("entrypoint")
    assert entrypoint in (None, ["queue-service"]), f"compose service {name} overrides the entrypoint"
    assert dockerfile()["entrypoint"] == ["queue-service"]
    command = service.get("command")
    assert command, f"compose service {name}: say which subcommand it runs"
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def compose_by_subcommand(subcommand: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose_queue_services().items() if check_argv(compose_argv(n, s), f"compose service {n}") == subcommand}


def compose_image_env(service: dict[str, Any]) -> dict[str, str]:
    targets = []
    for volume in service.get("volumes", []) + service.get("secrets", []):
        if isinstance(volume, dict):
            targets.append(str(volume.get("target", f"/run/secrets/{volume.get('source', '')}")))
        elif ":" in str(volume):
            targets.append(str(volume).split(":")[1])
        else:
            targets.append(f"/run/secrets/{volume}")
    return with_stand_in_files({**dockerfile()["env"], **compose_env(service)}, targets)


def option(argv: list[str], flag: str, default: str) -> str:
    for index, token in enumerate(argv):
        if token == flag:
            return argv[index + 1]
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return default


# -- the tests -------------------------------------------------------------------------------


def test_every_yaml_file_parses_with_its_top_level_keys() -> None:
    documents = yaml_documents()
    assert COMPOSE in documents and COLLECTOR in documents
    assert len(documents[COMPOSE]) == 1 and set(compose()) >= {"services"}
    assert set(documents[COLLECTOR][0]) >= {"receivers", "exporters", "service"}
    objects = k8s_objects()
    assert objects, "no Kubernetes manifests under deploy/k8s"
    for obj in objects:
        kind = obj.get("kind")
        assert kind in K8S_API_VERSIONS, f"unexpected kind {kind!r} under deploy/k8s"
        assert obj.get("apiVersion") == K8S_API_VERSIONS[kind], f"{kind} needs apiVersion {K8S_API_VERSIONS[kind]}"
        assert obj.get("metadata", {}).get("name"), f"{kind} without metadata.name"
        assert kind in ("ConfigMap", "Namespace") or "spec" in obj, f"{kind} {obj['metadata']['name']} has no spec"
    kinds = [o["kind"] for o in objects]
    for kind in ("Deployment", "ConfigMap", "PodDisruptionBudget", "Job"):
        assert kinds.count(kind) == 1, f"expected exactly one {kind}"
    assert "Service" in kinds


def test_the_cli_parser_is_read_for_real() -> None:
    options = cli_options()
    assert {"serve", "migrate", "dev", "core"} <= set(options)
    assert "--callback" in options["core"] and "--callback" not in options["serve"]
    with pytest.raises(AssertionError):
        check_argv(["server"], "example")
    with pytest.raises(AssertionError):
        check_argv(["core", "--call-back", "x:1"], "example")


def test_compose_runs_postgres_migrate_two_replicas_the_core_and_a_collector() -> None:
    services = compose()["services"]
    images = {n: str(s.get("image", "")) for n, s in services.items()}
    assert images.get("postgres") == "acurio-queue-postgres:15", "PostgreSQL from Debian's package (deploy/postgres)"
    assert services["postgres"]["build"]["context"] == "postgres" and (COMPOSE.parent / "postgres" / "Dockerfile").exists()
    assert any(i.startswith("otel/opentelemetry-collector") for i in images.values()), "an OTel collector"
    assert len(compose_by_subcommand("migrate")) == 1
    assert len(compose_by_subcommand("serve")) >= 2
    assert len(compose_by_subcommand("core")) == 1
    for name in services:
        assert name in compose_queue_services() or not images[name].startswith("acurio-queue-service"), name


def test_every_compose_queue_container_runs_a_real_subcommand_with_known_settings() -> None:
    queue_services = compose_queue_services()
    assert queue_services
    for name, service in queue_services.items():
        subcommand = check_argv(compose_argv(name, service), f"compose service {name}")
        env = compose_env(service)
        check_env_names(list(env), f"compose service {name}")
        if subcommand in ("serve", "migrate"):
            config = config_of(compose_image_env(service), f"compose service {name}")
            assert config.database_url, f"compose service {name}: DATABASE_URL"


def test_compose_replicas_reach_their_dependencies_and_probe_grpc_health() -> None:
    services = compose()["services"]
    (migrate_name,) = compose_by_subcommand("migrate")
    ((core_name, core),) = compose_by_subcommand("core").items()
    core_listen = option(compose_argv(core_name, core), "--listen", "127.0.0.1:50061")
    postgres = next(n for n, s in services.items() if str(s.get("image", "")).startswith("acurio-queue-postgres:"))
    collector = next(n for n, s in services.items() if str(s.get("image", "")).startswith("otel/opentelemetry-collector"))
    collector_grpc = yaml_documents()[COLLECTOR][0]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    for name, service in compose_by_subcommand("serve").items():
        config = serve_config_of(compose_image_env(service), f"compose service {name}")
        assert config.core_addr.rpartition(":")[0] == core_name and port_of(config.core_addr) == port_of(core_listen)
        assert re.match(rf"postgres(ql)?://[^@/]*@{re.escape(postgres)}(:\d+)?/", config.database_url), config.database_url
        depends = service.get("depends_on") or {}
        assert depends.get(postgres, {}).get("condition") == "service_healthy", f"{name} waits for a healthy {postgres}"
        if not config.migrate_on_start:
            assert depends.get(migrate_name, {}).get("condition") == "service_completed_successfully", (
                f"{name} has QUEUE_MIGRATE_ON_START=false, so it must wait for {migrate_name} to finish"
            )
        # Quiet by default: the collector runs only with its profile, so nothing exports unless
        # asked to; the header's telemetry line points the replicas at the collector.
        assert compose_env(service).get("OTEL_EXPORTER_OTLP_ENDPOINT", "") == "", f"{name} exports OTLP without the telemetry profile"
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://{collector}:{port_of(collector_grpc)} " in COMPOSE.read_text()
        probe = service.get("healthcheck", {}).get("test")
        assert isinstance(probe, list) and probe[:3] == ["CMD", "queue-service", "probe"], f"{name}: {probe}"
        probed = option(probe[2:], "--addr", config.listen_addr)
        assert port_of(probed) == port_of(config.listen_addr), f"{name} probes {probe}, listens on {config.listen_addr}"
        grace = seconds(service.get("stop_grace_period", "10s"))
        assert grace > shutdown_budget(config), f"{name}: stop_grace_period {grace}s <= drain budget {shutdown_budget(config)}s"
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_the_image_builds_from_the_local_debian_base_and_checks_its_own_health() -> None:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    bases = re.findall(r"^FROM\s+(\S+)", text, re.MULTILINE)
    # No registry image: every stage starts from the base deploy/build-image makes with mmdebstrap.
    assert bases and set(bases) == {"${BASE_IMAGE}"}, bases
    assert re.search(r"^ARG BASE_IMAGE=acurio-queue-base:bookworm$", text, re.MULTILINE)
    final = re.split(r"^FROM\s", text, flags=re.MULTILINE)[-1]
    healthcheck = re.search(r"^HEALTHCHECK\s.*CMD\s+(\[.*\])\s*$", final, re.MULTILINE)
    assert healthcheck, "the final stage needs a HEALTHCHECK"
    check_argv(json.loads(healthcheck.group(1)), "Dockerfile HEALTHCHECK")
    assert json.loads(healthcheck.group(1))[:2] == ["queue-service", "probe"]
    assert dockerfile()["uid"] != 0


def test_unauthenticated_compose_replicas_publish_on_loopback_only() -> None:
    for name, service in compose_by_subcommand("serve").items():
        config = serve_config_of(compose_image_env(service), f"compose service {name}")
        if config.auth_file:
            continue
        for port in service.get("ports", []):
            published = port if isinstance(port, str) else f"{port.get('host_ip', '')}:{port.get('published')}:{port['target']}"
            assert published.count(":") == 2 and published.startswith("127.0.0.1:"), (
                f"compose service {name} runs without QUEUE_AUTH_FILE but publishes {port!r} beyond 127.0.0.1"
            )


def test_the_dev_core_calls_back_to_a_replica_and_listens_beyond_localhost() -> None:
    services = compose()["services"]
    ((core_name, core),) = compose_by_subcommand("core").items()
    argv = compose_argv(core_name, core)
    assert option(argv, "--listen", "127.0.0.1:50061").startswith("0.0.0.0:"), "other containers must reach the core"
    callback = option(argv, "--callback", "127.0.0.1:50051")
    host, port = callback.rpartition(":")[0], int(callback.rpartition(":")[2])
    replicas = compose_by_subcommand("serve")
    answering = {
        name
        for name, service in services.items()
        if name == host or host in ((service.get("networks") or {}).get("default") or {}).get("aliases", [])
    }
    assert answering and answering <= set(replicas), f"--callback {callback} must name serve replicas only, got {answering}"
    for name in answering:
        assert port == port_of(config_of(compose_image_env(replicas[name]), name).listen_addr)


def test_the_collector_config_is_wired_and_mounted() -> None:
    config = yaml_documents()[COLLECTOR][0]
    pipelines = config["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipelines)
    for name, pipeline in pipelines.items():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in (config.get(section) or {}), f"pipeline {name} uses undefined {section[:-1]} {component}"
    assert set(config["exporters"]) & {"debug", "logging"}
    services = compose()["services"]
    collector = next(s for s in services.values() if str(s.get("image", "")).startswith("otel/opentelemetry-collector"))
    mounts = [str(v).split(":")[0] for v in collector.get("volumes", [])]
    assert any((DEPLOY / m).resolve() == COLLECTOR for m in mounts), f"the collector mounts {mounts}"


# -- Kubernetes ------------------------------------------------------------------------------


def pod_spec(kind: str) -> dict[str, Any]:
    return k8s_one(kind)["spec"]["template"]["spec"]


def container_env(container: dict[str, Any], where: str, configmap: dict[str, Any] | None = None) -> dict[str, str]:
    """The container's environment as the service sees it: secrets as placeholders, and file
    settings pointing into a mounted volume as an existing stand-in file (a path that is not
    mounted stays, and `Config.from_env` refuses it, as it would in the pod). The ConfigMap is
    the file's unless given (a rendered one)."""
    configmap = configmap or k8s_one("ConfigMap")
    env: dict[str, str] = dict(dockerfile()["env"])
    refs = [e["configMapRef"]["name"] for e in container.get("envFrom", []) if "configMapRef" in e]
    assert refs in ([], [configmap["metadata"]["name"]]), f"{where}: envFrom may only be the ConfigMap, got {refs}"
    if refs:
        env.update({k: str(v) for k, v in configmap["data"].items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item.get("valueFrom", {}):
            env[item["name"]] = "postgresql://from-the-secret/queue"
    return with_stand_in_files(env, [m["mountPath"] for m in container.get("volumeMounts", [])])


def k8s_argv(container: dict[str, Any], where: str) -> list[str]:
    command = container.get("command")
    assert command in (None, ["queue-service"]), f"{where}: command {command}"
    return ["queue-service", *container.get("args", [])]


def test_configmap_holds_only_known_settings_and_no_database_url() -> None:
    data = k8s_one("ConfigMap")["data"]
    check_env_names(list(data), "ConfigMap")
    assert "DATABASE_URL" not in data, "DATABASE_URL belongs in a Secret"
    assert all(isinstance(v, str) for v in data.values()), "ConfigMap values must be strings (quote numbers)"


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_k8s_containers_run_a_real_subcommand_with_valid_settings_and_the_db_secret(kind: str) -> None:
    expected = {"Deployment": "serve", "Job": "migrate"}[kind]
    spec = pod_spec(kind)
    (container,) = spec["containers"]
    where = f"{kind} container {container['name']}"
    assert check_argv(k8s_argv(container, where), where) == expected
    check_env_names([e["name"] for e in container.get("env", [])], where)
    database = next(e for e in container["env"] if e["name"] == "DATABASE_URL")
    assert "value" not in database and database["valueFrom"]["secretKeyRef"]["key"] == "DATABASE_URL"
    config_of(container_env(container, where), where)
    assert container["image"] == pod_spec("Deployment")["containers"][0]["image"], f"{where}: same image as the replicas"
    security = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    assert security.get("runAsNonRoot") is True and security.get("runAsUser", dockerfile()["uid"]) == dockerfile()["uid"]
    assert container["securityContext"].get("readOnlyRootFilesystem") is True
    assert container["securityContext"].get("allowPrivilegeEscalation") is False
    resources = container.get("resources", {})
    assert {"cpu", "memory"} <= set(resources.get("requests", {})) and "memory" in resources.get("limits", {}), where


def test_the_replicas_start_and_find_their_file_settings_on_mounted_secrets() -> None:
    spec = pod_spec("Deployment")
    (container,) = spec["containers"]
    serve_config_of(container_env(container, "Deployment"), "Deployment")
    configmap = k8s_one("ConfigMap")["data"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"].rstrip("/"): volumes[m["name"]] for m in container.get("volumeMounts", [])}
    uid = dockerfile()["uid"]
    for setting in FILE_SETTINGS:
        env = SETTINGS[setting].env
        path = next((e.get("value", "") for e in container.get("env", []) if e["name"] == env), configmap.get(env, ""))
        if not path:
            continue
        volume = next((v for m, v in mounts.items() if path.startswith(m + "/")), None)
        assert volume is not None and "secret" in volume, f"{env}={path} is not on a mounted Secret"
        mode = volume["secret"].get("defaultMode", 0o644)
        group_readable = mode & 0o040 and spec.get("securityContext", {}).get("fsGroup") == uid
        assert mode & 0o004 or group_readable, f"{env}: uid {uid} cannot read {path} (defaultMode {mode:o})"


def test_the_migrate_job_runs_once_to_completion() -> None:
    job = k8s_one("Job")["spec"]
    assert job["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")
    assert job.get("backoffLimit", 6) <= 6


def test_the_deployment_probes_grpc_health_and_drains_within_its_grace() -> None:
    deployment = k8s_one("Deployment")
    assert deployment["spec"]["replicas"] >= 2
    spec = pod_spec("Deployment")
    (container,) = spec["containers"]
    config = config_of(container_env(container, "Deployment"), "Deployment")
    listen_port = port_of(config.listen_addr)
    assert listen_port in [p["containerPort"] for p in container["ports"]]
    assert {"readinessProbe", "livenessProbe"} <= set(container)
    for kind in PROBE_KINDS:
        if kind in container:
            probe = container[kind]
            assert set(probe) & {"httpGet", "tcpSocket", "exec", "grpc"} == {"grpc"}, f"{kind} must be a gRPC probe"
            assert probe["grpc"]["port"] == listen_port, f"{kind} probes {probe['grpc']['port']}, listens on {listen_port}"
    # Readiness follows the database; liveness must not, or a failover would restart every
    # replica at once (and a restart never mends a database).
    assert container["readinessProbe"]["grpc"].get("service", "") == "", "readiness must check the overall health service ''"
    assert container["livenessProbe"]["grpc"].get("service", "") == LIVENESS_SERVICE, (
        f"liveness must check the health service {LIVENESS_SERVICE!r}, which does not depend on the database"
    )
    # Readiness turns within a couple of seconds of the database failing (health turns within about one).
    readiness = container["readinessProbe"]
    assert readiness.get("periodSeconds", 10) * readiness.get("failureThreshold", 3) <= 4
    # ... but one slow answer (a check past its timeout) does not take a healthy replica out.
    assert readiness.get("failureThreshold", 3) >= 2, "readiness must tolerate one slow answer"
    # A replica started while the database is away waits QUEUE_DB_START_WAIT_SECONDS for it: the
    # startup probe must allow that, or the kubelet kills the replica while it waits.
    startup = container.get("startupProbe", {})
    allowed = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3) + startup.get("initialDelaySeconds", 0)
    assert allowed > config.db_start_wait_seconds + 10, (
        f"the startup probe allows {allowed}s, serve waits up to {config.db_start_wait_seconds}s for the database"
    )
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] in ("sleep", "/bin/sleep") and float(pre_stop[1]) > 0, pre_stop
    budget = float(pre_stop[1]) + shutdown_budget(config)
    assert spec["terminationGracePeriodSeconds"] > budget, (
        f"terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} <= preStop + drain = {budget}"
    )


def test_selectors_pick_the_replicas_and_not_the_migrate_job() -> None:
    deployment = k8s_one("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    job_labels = k8s_one("Job")["spec"]["template"]["metadata"]["labels"]
    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    pdb = k8s_one("PodDisruptionBudget")["spec"]
    assert pdb.get("minAvailable") == 1 and pdb["minAvailable"] < deployment["spec"]["replicas"]
    assert selects(pdb["selector"]["matchLabels"], pod_labels) and not selects(pdb["selector"]["matchLabels"], job_labels)
    for service in (o for o in k8s_objects() if o["kind"] == "Service"):
        name = service["metadata"]["name"]
        assert selects(service["spec"]["selector"], pod_labels), f"Service {name} does not select the replicas"
        assert not selects(service["spec"]["selector"], job_labels), f"Service {name} also selects the migrate Job"


def test_services_expose_grpc_and_the_metrics_port() -> None:
    (container,) = pod_spec("Deployment")["containers"]
    config = config_of(container_env(container, "Deployment"), "Deployment")
    container_ports = {p.get("name"): p["containerPort"] for p in container["ports"]}

    def target(port: dict[str, Any]) -> int:
        value = port.get("targetPort", port["port"])
        return container_ports[value] if isinstance(value, str) else value

    services = [o for o in k8s_objects() if o["kind"] == "Service"]
    for service in services:
        targets = [target(p) for p in service["spec"]["ports"]]
        assert port_of(config.listen_addr) in targets, f"Service {service['metadata']['name']} lacks the gRPC port"
    if config.metrics_addr:
        metrics_port = port_of(config.metrics_addr)
        assert metrics_port in container_ports.values(), "the container must declare the metrics port"
        assert any(metrics_port in [target(p) for p in s["spec"]["ports"]] for s in services), "no Service exposes metrics"


# -- network exposure ------------------------------------------------------------------------


def network_policies_selecting(labels: dict[str, str]) -> list[dict[str, Any]]:
    return [o for o in k8s_objects() if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"]["matchLabels"], labels)]


def policy_ports(rule: dict[str, Any], container_ports: dict[str, int]) -> set[tuple[int, str]]:
    """A rule's ports as (number, protocol), named container ports resolved."""
    ports = set()
    for port in rule.get("ports", []):
        assert "port" in port, f"a rule without a port opens every port: {rule}"
        number = container_ports[port["port"]] if isinstance(port["port"], str) else port["port"]
        ports.add((number, port.get("protocol", "TCP")))
    return ports


def test_a_network_policy_confines_the_replicas_to_their_callers_and_dependencies() -> None:
    """Ingress: the gRPC port from the callers' namespaces only, the metrics port from monitoring
    only; egress: DNS, PostgreSQL, the core and the OTLP collector, each on its own port; no rule
    open to every peer or every port."""
    pod_labels = k8s_one("Deployment")["spec"]["template"]["metadata"]["labels"]
    job_labels = k8s_one("Job")["spec"]["template"]["metadata"]["labels"]
    (policy,) = network_policies_selecting(pod_labels)
    assert policy not in network_policies_selecting(job_labels)
    spec = policy["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"}
    (container,) = pod_spec("Deployment")["containers"]
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    config = config_of(container_env(container, "Deployment"), "Deployment")

    allowed_in: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for rule in spec["ingress"]:
        assert rule.get("from"), f"an ingress rule without `from` admits everyone: {rule}"
        for peer in rule["from"]:
            assert "namespaceSelector" in peer and peer["namespaceSelector"].get("matchLabels"), f"every peer names its namespace: {peer}"
        for port in policy_ports(rule, container_ports):
            allowed_in.setdefault(port, []).extend(rule["from"])
    listen, metrics = (port_of(config.listen_addr), "TCP"), (port_of(config.metrics_addr), "TCP")
    http = (port_of(config.http_addr), "TCP")
    assert set(allowed_in) == {listen, http, metrics}, "only the gRPC, the console's and the metrics port are reachable"
    namespaces = lambda peers: {p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers}  # noqa: E731
    assert namespaces(allowed_in[metrics]) == {"monitoring"}
    assert namespaces(allowed_in[http]) == {"ingress-nginx", "acurio-ops"}, "the console: the ingress controller and operators"
    assert "monitoring" not in namespaces(allowed_in[listen]) and len(allowed_in[listen]) == 3, "web backend, core, operators"

    allowed_out: set[tuple[int, str]] = set()
    for rule in spec["egress"]:
        assert rule.get("to"), f"an egress rule without `to` reaches everyone: {rule}"
        allowed_out |= policy_ports(rule, container_ports)
    otlp_port = int(re.search(r":(\d+)/?$", container_env(container, "Deployment")["OTEL_EXPORTER_OTLP_ENDPOINT"]).group(1))
    assert allowed_out == {(53, "UDP"), (53, "TCP"), (5432, "TCP"), (port_of(config.core_addr), "TCP"), (otlp_port, "TCP")}


def test_the_migrate_job_has_its_own_closed_network_policy() -> None:
    job_labels = k8s_one("Job")["spec"]["template"]["metadata"]["labels"]
    (policy,) = network_policies_selecting(job_labels)
    spec = policy["spec"]
    assert set(spec["policyTypes"]) == {"Ingress", "Egress"} and not spec.get("ingress"), "nothing calls the migrate Job"
    assert all(rule.get("to") for rule in spec["egress"])
    assert set().union(*(policy_ports(rule, {}) for rule in spec["egress"])) == {(53, "UDP"), (53, "TCP"), (5432, "TCP")}


def test_the_manifests_turn_reflection_off() -> None:
    """Reflection describes every service, operator RPCs included, to any authenticated caller."""
    (container,) = pod_spec("Deployment")["containers"]
    assert config_of(container_env(container, "Deployment"), "Deployment").reflection is False


# -- the web console and the Connect endpoint ------------------------------------------------


def dockerfile_exposed() -> set[int]:
    final = re.split(r"^FROM\s", (ROOT / "Dockerfile").read_text(), flags=re.MULTILINE)[-1]
    return {int(port.split("/")[0]) for line in re.findall(r"^EXPOSE\s+(.*)$", final, re.MULTILINE) for port in line.split()}


def test_compose_replicas_serve_the_console_on_a_published_loopback_port() -> None:
    for name, service in compose_by_subcommand("serve").items():
        config = serve_config_of(compose_image_env(service), f"compose service {name}")
        assert config.http_addr, f"compose service {name} serves no console (QUEUE_HTTP_ADDR)"
        targets = [int(str(p).rsplit(":", 1)[-1]) for p in service.get("ports", [])]
        assert port_of(config.http_addr) in targets, f"compose service {name} does not publish its console port"
        assert port_of(config.http_addr) in dockerfile_exposed(), "the Dockerfile exposes the console's port"


def test_the_dockerfile_exposes_grpc_and_the_console() -> None:
    (container,) = pod_spec("Deployment")["containers"]
    config = config_of(container_env(container, "Deployment"), "Deployment")
    assert {port_of(config.listen_addr), port_of(config.http_addr)} <= dockerfile_exposed()


def test_k8s_serves_the_console_through_its_service_and_a_tls_ingress() -> None:
    (container,) = pod_spec("Deployment")["containers"]
    config = config_of(container_env(container, "Deployment"), "Deployment")
    assert config.http_addr, "the replicas serve the console (QUEUE_HTTP_ADDR in the ConfigMap)"
    container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    named = next(n for n, p in container_ports.items() if p == port_of(config.http_addr))
    service = next(o for o in k8s_objects() if o["kind"] == "Service" and o["spec"].get("clusterIP") != "None")
    service_port = next(p for p in service["spec"]["ports"] if p.get("targetPort") in (named, port_of(config.http_addr)))
    ingress = k8s_one("Ingress")
    tls_hosts = {h for entry in ingress["spec"].get("tls", []) for h in entry.get("hosts", []) if entry.get("secretName")}
    rules = ingress["spec"]["rules"]
    assert rules and all(rule.get("host") in tls_hosts for rule in rules), "every host of the ingress has TLS"
    for rule in rules:
        for path in rule["http"]["paths"]:
            backend = path["backend"]["service"]
            assert backend["name"] == service["metadata"]["name"]
            assert backend["port"].get("name", backend["port"].get("number")) in (service_port["name"], service_port["port"])


def plain_kustomize_render() -> list[dict[str, Any]]:
    """`kustomize build` of deploy/k8s for the only fields kustomization.yaml uses: its resources,
    each namespaced object put in its namespace."""
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    unread = sorted(set(kustomization) - {"apiVersion", "kind", "namespace", "resources"})
    assert unread == [], f"kustomization.yaml uses {unread}, which this plain reading does not apply: install kubectl"
    objects = []
    for name in kustomization["resources"]:
        for document in yaml_documents()[K8S / name]:
            rendered = copy.deepcopy(document)
            if rendered["kind"] != "Namespace":
                rendered["metadata"]["namespace"] = kustomization["namespace"]
            objects.append(rendered)
    return objects


@cache
def kubectl_kustomize_render() -> list[dict[str, Any]] | None:
    """What `kubectl kustomize deploy/k8s` renders (what `kubectl apply -k` sends); None without kubectl."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    done = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"kubectl kustomize deploy/k8s failed: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d is not None]


def kind_and_name(obj: dict[str, Any]) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def rendered_one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in the rendered manifests, found {len(found)}"
    return found[0]


def test_the_replicas_answer_every_host_of_the_rendered_ingress() -> None:
    """A browser reaches the console by an Ingress host, the controller passes that Host on, and a
    replica answers only the names its own host check allows (421 otherwise): every host the
    Ingress serves must pass that check with the ConfigMap's settings."""
    objects = kubectl_kustomize_render() or plain_kustomize_render()
    ingress = rendered_one(objects, "Ingress")
    deployment = rendered_one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    where = "rendered Deployment"
    config = serve_config_of(container_env(container, where, rendered_one(objects, "ConfigMap")), where)
    rules = ingress["spec"]["rules"]
    assert all(rule.get("host") for rule in rules), (
        "an Ingress rule without a host sends every Host, and the replicas refuse all but theirs"
    )
    hosts = {rule["host"] for rule in rules} | {h for entry in ingress["spec"].get("tls", []) for h in entry.get("hosts", [])}
    allowed = AllowedHosts(config.http_addr, config.http_allowed_hosts)
    refused = sorted(host for host in hosts if not allowed.allows(host.encode()))
    assert refused == [], f"the replicas answer 421 to the Ingress hosts {refused}: list them in QUEUE_HTTP_ALLOWED_HOSTS (configmap.yaml)"


def test_the_plain_render_is_what_kubectl_renders() -> None:
    """Where kubectl is missing, the Ingress test reads the kustomization itself: the same objects."""
    rendered = kubectl_kustomize_render()
    if rendered is None:
        pytest.skip("kubectl is not installed: nothing to compare the plain render with")
    assert sorted(rendered, key=kind_and_name) == sorted(plain_kustomize_render(), key=kind_and_name)


def test_kustomize_applies_every_object_but_the_job_in_its_namespace() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    assert kustomization["kind"] == "Kustomization"
    namespace = k8s_one("Namespace")["metadata"]["name"]
    assert kustomization["namespace"] == namespace
    listed = set(kustomization["resources"])
    files = {p.name for p in K8S.glob("*.yaml")} - {KUSTOMIZATION.name}
    job_file = next(name for name in files if any(d.get("kind") == "Job" for d in yaml_documents()[K8S / name]))
    # A Job's pod template is immutable: a second `apply -k` with a new image would fail on it.
    assert listed == files - {job_file}, f"kustomization.yaml lists {sorted(listed)}"


def test_each_replica_pod_migrates_before_it_serves() -> None:
    """`kubectl apply -k` orders no Job before a Deployment: the pod's init container does."""
    spec = pod_spec("Deployment")
    (init,) = spec["initContainers"]
    where = f"Deployment init container {init['name']}"
    assert check_argv(k8s_argv(init, where), where) == "migrate"
    database = next(e for e in init["env"] if e["name"] == "DATABASE_URL")
    assert database["valueFrom"]["secretKeyRef"]["key"] == "DATABASE_URL"
    config_of(container_env(init, where), where)
    assert init["image"] == spec["containers"][0]["image"]
    assert (
        init["securityContext"].get("readOnlyRootFilesystem") is True and init["securityContext"].get("allowPrivilegeEscalation") is False
    )
