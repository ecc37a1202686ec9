"""The Kubernetes quick start (README and docs/kubernetes.md) builds the image before it applies
manifests that name it: the image is published on no registry, so a quick start that applies
first leaves the pod in ``ErrImagePull``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "deploy" / "kubernetes" / "base"
APPLY = "kubectl apply -k deploy/kubernetes/base"


def _quick_start(page: Path) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.DOTALL)
    found = [b for b in blocks if APPLY in b]
    assert len(found) == 1, f"{page.name}: one block applies the base"
    return found[0].splitlines()


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "docs" / "kubernetes.md"])
def test_the_quick_start_builds_pushes_and_points_the_base_at_the_image_before_applying(
    page: Path,
) -> None:
    lines = _quick_start(page)
    images = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))["images"]
    ours = next(i for i in images if i["name"] == "coherence-guard")
    image = f"$REGISTRY/coherence-guard:{ours['newTag']}"
    apply = next(n for n, line in enumerate(lines) if APPLY in line)
    build = next(n for n, line in enumerate(lines) if f"docker build -t {image} ." in line)
    push = next(n for n, line in enumerate(lines) if f"docker push {image}" in line)
    edit = next(
        n
        for n, line in enumerate(lines)
        if f"cd deploy/kubernetes/base && kustomize edit set image {ours['name']}={image}" in line
    )
    assert build <= push <= edit < apply
