"""The Kubernetes quick start (README and docs/kubernetes.md) works as written.

Its shell block is run by bash as it stands, with ``docker`` and the cluster-facing ``kubectl``
commands replaced by functions that record their arguments, and ``kubectl apply -k DIR`` by the
real ``kubectl kustomize DIR``: what the block writes (the user's overlay) is what gets built,
with kubectl's own kustomize only (the standalone ``kustomize`` is not needed). The image it
builds and pushes is the image the pod runs; the overlay renders without prometheus-operator's
PodMonitor and with it once its commented component is uncommented; every tag the pages name is
the one the manifests name, the project's version; and compose runs the engine image Kubernetes
pins.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_tools import COMPOSE, compose_command
from tests.net import HANG_GUARD
from tests.test_kubernetes import KUBE, ROOT, _by_kind, _container, kubectl, kustomize, version

PAGES = [ROOT / "README.md", ROOT / "docs" / "kubernetes.md"]
BASE = KUBE / "base"
ENGINE_IMAGE = "vllm/vllm-openai"
#: What the block's cluster-facing commands do here: record their arguments, one line each;
#: ``kubectl apply -k DIR`` builds DIR with the real kubectl instead of applying it.
STUBS = r"""
docker() { printf 'docker %s\n' "$*" >>"$CALLS"; }
curl() { :; }
kubectl() {
    printf 'kubectl %s\n' "$*" >>"$CALLS"
    if [ "$1" = apply ] && [ "$2" = -k ]; then "$KUBECTL" kustomize "$3" >"$APPLIED"; fi
}
"""


def quick_start(page: Path) -> str:
    """The page's one shell block that applies the proxy with ``kubectl apply -k``."""
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    found = [b for b in blocks if "kubectl apply -k" in b and "coherence-guard" in b]
    assert len(found) == 1, f"{page.name}: one block applies the proxy"
    return found[0]


def run_quick_start(block: str, workdir: Path, registry: str) -> tuple[list[str], list[Any]]:
    """Run ``block`` in ``workdir`` (a checkout's ``deploy`` beside it) with ``REGISTRY``
    set as the block sets it; returns the recorded commands and the documents applied."""
    shutil.copytree(KUBE, workdir / "deploy" / "kubernetes")
    block = re.sub(r"(?m)^REGISTRY=\S+", f"REGISTRY={registry}", block)
    calls, applied = workdir / "calls.txt", workdir / "applied.yaml"
    env = {"PATH": "/usr/bin:/bin", "CALLS": str(calls), "APPLIED": str(applied)}
    env["KUBECTL"] = kubectl()
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", STUBS + block],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=HANG_GUARD,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    docs = [d for d in yaml.safe_load_all(applied.read_text()) if d] if applied.exists() else []
    return calls.read_text().splitlines(), docs


def proxy_image(docs: list[Any]) -> str:
    (deployment,) = _by_kind(docs, "Deployment")
    proxy = _container(deployment["spec"]["template"]["spec"], "coherence-guard")
    assert proxy is not None
    return str(proxy["image"])


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
@pytest.mark.parametrize("registry", ["registry.example.com/team", "localhost:5000"])
def test_the_quick_start_runs_the_image_it_built_and_pushed(
    page: Path, registry: str, tmp_path: Path
) -> None:
    calls, applied = run_quick_start(quick_start(page), tmp_path, registry)
    image = f"{registry}/coherence-guard:{version()}"
    commands = [c.split()[:2] for c in calls]
    assert commands == [
        ["docker", "build"],
        ["docker", "push"],
        ["kubectl", "create"],
        ["kubectl", "apply"],
    ] + [["kubectl", "port-forward"]] * ("port-forward" in calls[-1])
    assert calls[0] == f"docker build -t {image} ."
    assert calls[1] == f"docker push {image}"
    assert calls[2].startswith("kubectl create secret generic coherence-guard-secrets ")
    assert proxy_image(applied) == image
    # No prometheus-operator needed: nothing but Kubernetes' own kinds.
    assert sorted(d["kind"] for d in applied) == ["ConfigMap", "Deployment", "Service"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_uncommenting_the_podmonitor_lines_adds_it(page: Path, tmp_path: Path) -> None:
    block = quick_start(page)
    commented = re.findall(r"(?m)^# (components:.*|  - \S+/components/podmonitor)$", block)
    assert len(commented) == 2, "the overlay holds the PodMonitor component, commented out"
    for line in commented:
        block = block.replace(f"# {line}", line.split("  # ")[0])
    _, applied = run_quick_start(block, tmp_path, "registry.example.com/team")
    (monitor,) = _by_kind(applied, "PodMonitor")
    assert monitor["apiVersion"].startswith("monitoring.coreos.com/")


_TAGGED = re.compile(r"coherence-guard:([\w.\-]+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_tag_the_page_names_is_the_one_built_and_applied(page: Path) -> None:
    """Each ``coherence-guard:TAG`` on the page is the project's version, which the base's
    manifests name; ``kind load`` loads a tag the page has just built."""
    text = page.read_text(encoding="utf-8")
    tags = set(_TAGGED.findall(text))
    assert tags == {version()}, tags
    assert proxy_image(kustomize(BASE)) == f"coherence-guard:{version()}"
    for loaded in re.finditer(r"kind load docker-image (\S+?)`", text):
        before = text[: loaded.start()]
        assert f"docker build -t {loaded[1]} ." in before[-400:], loaded[1]


def test_the_manifests_and_the_deploy_comments_name_the_version() -> None:
    """The tags written into the manifests and their comments (the sidecar's own image, the
    kustomizations' ``newTag``, the commands in their comments) are the version too."""
    tags: dict[str, set[str]] = {}
    for path in KUBE.rglob("*.yaml"):
        text = path.read_text()
        found = set(_TAGGED.findall(text))
        if path.name == "kustomization.yaml":
            for image in (yaml.safe_load(text) or {}).get("images", []):
                if image["name"] == "coherence-guard":
                    found.add(str(image["newTag"]))
        if found:
            tags[str(path.relative_to(KUBE))] = found
    assert tags and all(found == {version()} for found in tags.values()), tags


def _engine_tags() -> dict[str, str]:
    """Where the engine's image is named: compose (its default), the base's Deployment and the
    base's ``images`` (what is applied), tag by tag."""
    out = subprocess.run(
        [*compose_command(), "-f", str(COMPOSE), "--project-directory", str(ROOT),
         "config", "--format", "json"],
        capture_output=True, text=True, timeout=HANG_GUARD,
        env={k: v for k, v in os.environ.items() if k != "VLLM_TAG"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    compose_image = json.loads(out.stdout)["services"]["vllm"]["image"]
    manifest = yaml.safe_load((BASE / "vllm.yaml").read_text())
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    images = yaml.safe_load((BASE / "kustomization.yaml").read_text())["images"]
    (pinned,) = [i for i in images if i["name"] == ENGINE_IMAGE]
    (deployment,) = _by_kind(kustomize(BASE), "Deployment")
    applied = _container(deployment["spec"]["template"]["spec"], "vllm")
    assert applied is not None
    tags = {
        "docker-compose.yml": compose_image,
        "base/vllm.yaml": container["image"],
        "base/kustomization.yaml": f"{ENGINE_IMAGE}:{pinned['newTag']}",
        "applied": applied["image"],
    }
    return {where: image.removeprefix(ENGINE_IMAGE + ":") for where, image in tags.items()}


def test_compose_and_kubernetes_run_the_same_pinned_engine() -> None:
    tags = _engine_tags()
    assert len(set(tags.values())) == 1, tags
    (tag,) = set(tags.values())
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), f"{tag}: a release, not a moving tag"
