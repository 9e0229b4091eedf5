"""Client side of "build a snapshot from a declarative file" (Agentuity-compatible).

The build file lives in the build directory as ``agentuity-snapshot.{yaml,yml,json}`` (or
``hutch-snapshot.*``) unless a path is given. YAML or JSON, with these top-level keys:

    version: 1                  # required, the integer 1
    runtime: bun:1              # required base runtime
    name: my-snapshot           # optional, [a-zA-Z0-9_-]+
    description: ...            # optional
    dir: app                    # optional build context, a subdirectory of the build directory
    dependencies: [curl]        # apt packages, ``pkg`` or ``pkg=version``
    packages: [typescript]      # npm/bun packages
    files: ["src/**", "!**/*.test.js"]  # globs relative to the context
    env: {API_KEY: ${SECRET}}   # ${VAR} filled from the caller's --env KEY=VALUE
    metadata: {v: ${VERSION}}   # ${VAR} filled from the caller's --metadata KEY=VALUE
    public: false

Unknown keys are errors, and at least one of dependencies, files, env or packages must be
non-empty. Every problem is a :class:`BuildFileError` naming the file, the field and the value.

File patterns follow minimatch: ``*`` and ``?`` stay within one path segment, ``**`` spans
any number of directories, ``*.js`` matches top-level files only, a plain path such as
``src`` selects everything below it, and ``!pattern`` removes what the include patterns
selected (order does not matter). As in minimatch, include wildcards skip dotfiles unless
the pattern spells the dot (``.env``, ``**/.*``), so ``.git`` or a stray ``.env`` is never
shipped by accident; exclusion wildcards do match dotfiles.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO, NoReturn

import attrs
import yaml

from hutch.core.packages import APT_RE, NPM_RE

__all__ = [
    "BUILD_FILE_NAMES", "BuildFileError", "BuildSpec", "SelectedFile", "content_hash",
    "find_build_file", "load_build_file", "resolve_context", "select_files", "template",
    "write_archive",
]

BUILD_FILE_NAMES = tuple(f"{stem}.{ext}" for stem in ("agentuity-snapshot", "hutch-snapshot")
                         for ext in ("yaml", "yml", "json"))
_EMPTY: Mapping[str, str] = MappingProxyType({})
_KEYS = {"version", "runtime", "name", "description", "dir", "dependencies", "packages",
         "files", "env", "metadata", "public"}
_NAME = re.compile(r"[a-zA-Z0-9_-]+")
# The server's rules (core.packages): registry npm specs only, apt names with optional =version.
_PACKAGE = NPM_RE
_APT = APT_RE
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class BuildFileError(ValueError):
    """A build file, a file pattern or a selected file that cannot be built."""


# BuildSpec's converters: typed (unlike bare tuple/dict) so mypy knows what the fields take.
def _strings(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _string_map(items: Mapping[str, str]) -> dict[str, str]:
    return dict(items)


@attrs.frozen
class BuildSpec:
    runtime: str
    name: str | None = None
    description: str | None = None
    dir: str | None = None
    dependencies: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    packages: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    files: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    env: dict[str, str] = attrs.field(factory=dict, converter=_string_map)
    metadata: dict[str, str] = attrs.field(factory=dict, converter=_string_map)
    public: bool = False


@attrs.frozen
class SelectedFile:
    path: str  # posix, relative to the build context
    source: Path  # the real file (symlinks inside the context resolved)
    size: int
    mode: int  # permission bits only
    sha256: str


def find_build_file(directory: str | Path, file: str | None = None) -> Path:
    """The explicit ``file`` (relative to the working directory, like any CLI path), or the
    first of :data:`BUILD_FILE_NAMES` present in ``directory``."""
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise BuildFileError(f"{file}: build file not found")
        return path
    directory = Path(directory)
    if not directory.is_dir():
        raise BuildFileError(f"{directory}: build directory not found")
    for name in BUILD_FILE_NAMES:
        if (directory / name).is_file():
            return directory / name
    raise BuildFileError(f"{directory}: no build file; expected one of {', '.join(BUILD_FILE_NAMES)}")


def load_build_file(path: str | Path, *, env_vars: Mapping[str, str] = _EMPTY,
                    metadata_vars: Mapping[str, str] = _EMPTY) -> BuildSpec:
    """Parse (JSON for ``.json``, YAML otherwise: YAML reads JSON too) and validate."""
    path = Path(path)
    fields = _BuildFields(path.name, _read_build_file(path))
    runtime = fields.check_header()
    name, description, subdir = fields.check_names()
    dependencies, packages, files = fields.check_lists()
    env = fields.mapping("env", env_vars, "--env")
    metadata = fields.mapping("metadata", metadata_vars, "--metadata")
    public = fields.doc.get("public", False)
    if not isinstance(public, bool):
        fields.fail("public", public, "must be true or false")
    if not (dependencies or files or env or packages):
        raise BuildFileError(f"{fields.label}: at least one of dependencies, files, env or packages must be non-empty")
    return BuildSpec(runtime=runtime, name=name, description=description, dir=subdir,
                     dependencies=dependencies, packages=packages, files=files, env=env,
                     metadata=metadata, public=public)


def _read_build_file(path: Path) -> dict[Any, Any]:
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        raise BuildFileError(f"{path.name}: cannot read build file: {e}") from None
    if not isinstance(doc, dict):
        raise BuildFileError(f"{path.name}: the build file must be a mapping of fields, not {type(doc).__name__}")
    return doc


@attrs.frozen
class _BuildFields:
    """A build file's parsed fields and their checks; each failure names the file, field and value."""

    label: str  # the build file's name
    doc: dict[Any, Any]

    def fail(self, field: str, value: object, why: str) -> NoReturn:
        raise BuildFileError(f"{self.label}: {field}: {value!r} {why}")

    def check_header(self) -> str:
        """No unknown keys, and the required ``version`` and ``runtime``; returns the runtime."""
        doc = self.doc
        if unknown := [key for key in doc if key not in _KEYS]:
            self.fail(str(unknown[0]), doc[unknown[0]], f"is not a known field (known: {', '.join(sorted(_KEYS))})")
        for field in ("version", "runtime"):
            if field not in doc:
                raise BuildFileError(f"{self.label}: {field}: is required")
        # bool is an int in Python, and `version: true` is surely not meant as 1
        if type(doc["version"]) is not int or doc["version"] != 1:
            self.fail("version", doc["version"], "is not supported; version must be 1")
        runtime = doc["runtime"]
        if not isinstance(runtime, str) or not runtime or any(c.isspace() for c in runtime):
            self.fail("runtime", runtime, "must be a runtime name such as 'bun:1' or 'python:3.13'")
        return runtime

    def optional_str(self, field: str) -> str | None:
        value = self.doc.get(field)
        if value is not None and not isinstance(value, str):
            self.fail(field, value, "must be a string")
        return value

    def check_names(self) -> tuple[str | None, str | None, str | None]:
        """``name``, ``description`` and ``dir``."""
        name, description, subdir = self.optional_str("name"), self.optional_str("description"), self.optional_str("dir")
        if name is not None and not _NAME.fullmatch(name):
            self.fail("name", name, "may only hold letters, digits, _ and -")
        if subdir is not None and (not subdir or _outside(subdir)):
            self.fail("dir", subdir, "must be a relative path inside the build directory")
        return name, description, subdir

    def strings(self, field: str, rule: re.Pattern[str] | None, why: str) -> tuple[str, ...]:
        items = [] if self.doc.get(field) is None else self.doc[field]  # `or` would pass `false` or 0
        if not isinstance(items, list):
            self.fail(field, items, "must be a list of strings")
        for i, item in enumerate(items):
            if not isinstance(item, str) or not item or (rule is not None and not rule.fullmatch(item)):
                self.fail(f"{field}[{i}]", item, why)
        return tuple(items)

    def check_lists(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """``dependencies``, ``packages`` and ``files`` (whose patterns must compile)."""
        dependencies = self.strings("dependencies", _APT, "must be an apt package, 'pkg' or 'pkg=version'")
        packages = self.strings("packages", _PACKAGE,
                                "must be a registry package: name, name@version or @scope/name@tag")
        files = self.strings("files", None, "must be a non-empty glob pattern")
        for i, pattern in enumerate(files):
            try:
                _compile(pattern)
            except BuildFileError as e:
                raise BuildFileError(f"{self.label}: files[{i}]: {e}") from None
        return dependencies, packages, files

    def mapping(self, field: str, variables: Mapping[str, str], flag: str) -> dict[str, str]:
        """``env`` or ``metadata``, with each ``${VAR}`` filled from ``variables``."""
        items = {} if self.doc.get(field) is None else self.doc[field]
        if not isinstance(items, dict):
            self.fail(field, items, "must be a mapping of names to strings")
        out = {}
        for key, value in items.items():
            if not isinstance(key, str) or (field == "env" and not _ENV_KEY.fullmatch(key)):
                self.fail(field, key, "is not a valid key")
            if not isinstance(value, str):
                self.fail(f"{field}.{key}", value, "must be a string (quote it in YAML)")
            for var in _VAR.findall(value):
                if var not in variables:
                    self.fail(f"{field}.{key}", value, f"uses ${{{var}}}, which is not set (pass {flag} {var}=...)")
            out[key] = _VAR.sub(lambda m: variables[m.group(1)], value)
        return out


def resolve_context(directory: str | Path, spec: BuildSpec) -> Path:
    """The build context: ``directory``, or its ``spec.dir`` subdirectory, which must not
    lead outside ``directory`` even through symlinks."""
    base = Path(directory).resolve()
    context = (base / spec.dir).resolve() if spec.dir else base
    if not context.is_relative_to(base) or not context.is_dir():
        raise BuildFileError(f"dir: {spec.dir!r} is not a directory inside {str(base)!r}")
    return context


def _outside(path: str) -> bool:
    return path.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", path) is not None or ".." in re.split(r"[/\\]", path)


_ANY = None  # the `**` piece of a compiled pattern
_Pieces = tuple[re.Pattern[str] | None, ...]


def _compile(pattern: str) -> tuple[bool, _Pieces]:
    """(negated, pieces): one regex per path segment, None for `**`."""
    negated = pattern.startswith("!")
    body = pattern[1:] if negated else pattern
    if _outside(body):
        raise BuildFileError(f"{pattern!r} must stay inside the build context (no absolute paths or ..)")
    segments = [s for s in body.split("/") if s not in ("", ".")]
    if not segments:
        raise BuildFileError(f"{pattern!r} is an empty pattern")
    pieces: list[re.Pattern[str] | None] = []
    for segment in segments:
        if segment == "**":
            if not pieces or pieces[-1] is not _ANY:  # `**/**` is just `**`
                pieces.append(_ANY)
            continue
        # exclusions match dotfiles: failing to exclude something is the dangerous direction
        out = [] if negated or segment.startswith(".") else [r"(?!\.)"]
        i = 0
        while i < len(segment):
            c = segment[i]
            if c == "*":
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[" and (j := segment.find("]", i + 2)) != -1:  # `[]...]`: first ] is literal
                cls = segment[i + 1:j]
                neg = cls[0] in "!^"
                # escape all but ranges so Python's set operators (&&, ~~, [) stay literal
                cls = "".join(ch if ch == "-" or ch.isalnum() else "\\" + ch for ch in cls[neg:])
                out.append(f"[{'^' if neg else ''}{cls}]")
                i = j
            else:
                out.append(re.escape(c))
            i += 1
        try:
            pieces.append(re.compile("".join(out)))
        except re.error as e:
            raise BuildFileError(f"{pattern!r} is not a valid pattern: {e}") from None
    if not any(c in body for c in "*?["):
        pieces.append(_ANY)  # a plain path also selects everything below it, like a directory
    return negated, tuple(pieces)


def _match(pieces: _Pieces, segs: tuple[str, ...], dot: bool, below: bool = False) -> bool:
    """Whether the path ``segs`` matches, or with ``below`` whether a path under it could.
    ``dot``: whether `**` may step over dot directories (exclusions only, see _compile)."""
    if not pieces:
        return not segs and not below
    if not segs:
        return below or all(p is _ANY for p in pieces)
    head = pieces[0]
    if head is _ANY:  # zero segments, or one more
        return _match(pieces[1:], segs, dot, below) or (
            (dot or not segs[0].startswith(".")) and _match(pieces, segs[1:], dot, below))
    return head.fullmatch(segs[0]) is not None and _match(pieces[1:], segs[1:], dot, below)


def select_files(context: Path, patterns: Sequence[str]) -> list[SelectedFile]:
    """The regular files under ``context`` selected by ``patterns``, sorted by path."""
    root = Path(context).resolve()  # real paths, so symlink targets compare against it
    if not root.is_dir():
        raise BuildFileError(f"{str(context)!r} is not a directory")
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(_compile(pattern))
        except BuildFileError as e:
            raise BuildFileError(f"files: {e}") from None
    includes = [p for neg, p in compiled if not neg]
    excludes = [p for neg, p in compiled if neg]

    def selected(parts: tuple[str, ...]) -> bool:
        return any(_match(p, parts, False) for p in includes) and not any(
            _match(p, parts, True) for p in excludes)

    def descend(parts: tuple[str, ...]) -> bool:
        # skip directories nothing could select, or that an exclusion removes whole
        # (node_modules/**): faster, and their outside symlinks are then no concern
        return any(_match(p, parts, False, below=True) for p in includes) and not any(
            p[-1] is _ANY and _match(p[:-1], parts, True) for p in excludes)

    found: list[SelectedFile] = []

    def walk(directory: Path, parts: tuple[str, ...], ancestors: frozenset[Path]) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            sub = (*parts, entry.name)
            rel = "/".join(sub)
            real: Path | None = Path(entry.path)
            if entry.is_symlink():
                try:
                    real = Path(entry.path).resolve(strict=True)
                except (OSError, RuntimeError):  # dangling, or a loop of links
                    real = None
            if real is None:
                if selected(sub):
                    raise BuildFileError(f"files: {rel!r} is a dangling symlink")
                continue
            if not real.is_relative_to(root):
                if selected(sub) or (real.is_dir() and descend(sub)):
                    raise BuildFileError(f"files: {rel!r} is a symlink to {str(real)!r}, outside the build context")
                continue
            st = real.stat()
            if stat.S_ISDIR(st.st_mode) and descend(sub):
                if real in ancestors:
                    raise BuildFileError(f"files: {rel!r} is a symlink loop")
                walk(real, sub, ancestors | {real})
            elif stat.S_ISREG(st.st_mode) and selected(sub):
                found.append(SelectedFile(path=rel, source=real, size=st.st_size,
                                          mode=stat.S_IMODE(st.st_mode), sha256=_sha256(real)))

    walk(root, (), frozenset({root}))
    return sorted(found, key=lambda f: f.path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(spec: BuildSpec, files: Sequence[SelectedFile]) -> str:
    """Hex sha256 of everything that shapes the snapshot, so an unchanged build can be
    recognised: not mtimes, not ``public`` or ``dir`` (visibility and layout, not content)."""
    doc: dict[str, Any] = {
        "runtime": spec.runtime, "name": spec.name, "description": spec.description,
        "dependencies": list(spec.dependencies), "packages": list(spec.packages),
        "env": spec.env, "metadata": spec.metadata,
        "files": [[f.path, f.mode, f.sha256] for f in sorted(files, key=lambda f: f.path)],
    }
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


class _Verified:
    """A reader that hashes what tarfile copies, to catch a file changed since selection."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.digest = f, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.digest.update(data)
        return data


def write_archive(files: Sequence[SelectedFile], out: BinaryIO) -> None:
    """A deterministic .tar.gz of ``files`` at their relative paths. Same as tarfile's
    "w|gz" but through our own GzipFile: tarfile stamps the gzip header with the time."""
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.size, info.mode, info.type = f.size, f.mode, tarfile.REGTYPE
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with f.source.open("rb") as src:
                reader = _Verified(src)
                try:
                    tar.addfile(info, reader)
                except OSError:  # tarfile's "unexpected end of data": the file shrank
                    reader.digest.update(b"!")
                if src.read(1) or reader.digest.hexdigest() != f.sha256:
                    raise BuildFileError(f"files: {f.path!r} changed while it was being archived")


_TEMPLATE = """\
# Snapshot build file: builds a reusable sandbox snapshot from this directory.
# Schema version; must be 1.
version: 1
# Base runtime the snapshot starts from (e.g. bun:1, node:22, python:3.13).
runtime: bun:1
# Optional name for the snapshot: letters, digits, _ and - only.
name: my-snapshot
# Optional human-readable description.
description: My custom snapshot
# Optional subdirectory to use as the build context instead of this directory.
# dir: app
# System (apt) packages to install: `pkg` or `pkg=version`.
dependencies:
  - curl
# npm/bun packages to install globally, e.g. typescript or zod@3.
# packages:
#   - typescript
# Files to copy into the snapshot: globs relative to the build context. `*` stays in one
# directory, `**` spans any number; a leading `!` excludes files the others selected.
files:
  - "*.js"
  - "src/**"
  - "!**/*.test.js"
  - "!node_modules/**"
# Environment variables set in the snapshot; ${NAME} is filled from --env NAME=VALUE.
env:
  NODE_ENV: production
  API_KEY: ${SECRET_KEY}
# Free-form string metadata; ${NAME} is filled from --metadata NAME=VALUE.
metadata:
  version: ${VERSION}
# Whether other organizations may use this snapshot.
# public: false
"""


def template(fmt: str = "yaml") -> str:
    """A starter build file: commented YAML, or the same content as JSON (no comments)."""
    if fmt == "yaml":
        return _TEMPLATE
    if fmt == "json":
        return json.dumps(yaml.safe_load(_TEMPLATE), indent=2) + "\n"
    raise BuildFileError(f"template format {fmt!r} is not supported; use 'yaml' or 'json'")
