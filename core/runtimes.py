"""The runtime catalog: declarative recipes, one per runtime name.

A recipe is pure data (Debian suite + packages + metadata). Drivers turn it into a
root filesystem or an OCI image; its ``recipe_hash`` keys the build cache so an
unchanged recipe is never rebuilt.
"""

from __future__ import annotations

import hashlib
import json

import attrs


@attrs.frozen
class Requirements:
    memory: str | None = None
    cpu: str | None = None
    disk: str | None = None
    network_enabled: bool = False


@attrs.frozen
class RuntimeRecipe:
    name: str
    description: str
    suite: str  # Debian suite the root filesystem is built from
    packages: tuple[str, ...]
    version_command: tuple[str, ...]  # prints what the name promises (checked by tests)
    version_expect: str  # substring the version command's output must contain
    tags: tuple[str, ...] = ()
    requirements: Requirements = Requirements()
    icon_url: str | None = None
    brand_color: str | None = None
    url: str | None = None
    readme: str | None = None

    @property
    def id(self) -> str:
        # Stable across restarts and hosts: the id names the runtime, not a build of it.
        return "srt_" + hashlib.sha256(self.name.encode()).hexdigest()[:24]

    @property
    def recipe_hash(self) -> str:
        recipe = {"suite": self.suite, "packages": sorted(self.packages), "format": 1}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


# Packages every runtime gets: a shell, coreutils, CA certificates and a few tools agents use.
_BASE_PACKAGES = ("bash", "coreutils", "ca-certificates", "procps", "less", "findutils", "grep", "sed", "tar", "gzip")

CATALOG: tuple[RuntimeRecipe, ...] = (
    RuntimeRecipe(
        name="base:latest",
        description="Minimal base runtime with essential tools (default)",
        suite="trixie",
        packages=_BASE_PACKAGES,
        version_command=("bash", "--version"),
        version_expect="GNU bash",
        tags=("base", "shell", "linux"),
        requirements=Requirements(memory="256Mi", cpu="500m", disk="512Mi"),
        icon_url="https://www.debian.org/logos/openlogo-nd.svg",
        brand_color="#A80030",
        url="https://www.debian.org",
        readme="Debian trixie (minbase) with bash, coreutils, procps, tar and gzip.",
    ),
    RuntimeRecipe(
        name="python:3.13",
        description="Python 3.13 with uv package manager",
        suite="trixie",
        packages=(*_BASE_PACKAGES, "python3", "python3-pip", "python3-venv"),
        version_command=("python3", "--version"),
        version_expect="Python 3.13",
        tags=("python", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://www.python.org/static/favicon.ico",
        brand_color="#3776AB",
        url="https://www.python.org",
        readme="Debian trixie's python3.13 with pip and venv.",
    ),
)

DEFAULT_RUNTIME = "base:latest"


def find(name_or_id: str) -> RuntimeRecipe | None:
    for recipe in CATALOG:
        if name_or_id in (recipe.name, recipe.id):
            return recipe
    return None
