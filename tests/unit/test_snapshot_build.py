from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from hutch.snapshot_build import (
    BuildFileError,
    BuildSpec,
    content_hash,
    find_build_file,
    load_build_file,
    resolve_context,
    select_files,
    template,
    write_archive,
)

VALID = {
    "version": 1,
    "runtime": "bun:1",
    "name": "my-snap_1",
    "description": "A snapshot",
    "dependencies": ["curl", "git=1:2.39.2-1"],
    "packages": ["typescript", "zod@3"],
    "files": ["*.js", "src/**", "!**/*.test.js"],
    "env": {"NODE_ENV": "production", "API_KEY": "key-${SECRET}"},
    "metadata": {"version": "${VERSION}"},
    "public": True,
}


def write(path: Path, doc: object) -> Path:
    text = json.dumps(doc) if path.suffix == ".json" else yaml.safe_dump(doc)
    path.write_text(text)
    return path


def load(tmp_path: Path, doc: object, name: str = "agentuity-snapshot.yaml", *,
         env_vars: Mapping[str, str] = {}, metadata_vars: Mapping[str, str] = {}) -> BuildSpec:
    return load_build_file(write(tmp_path / name, doc), env_vars=env_vars, metadata_vars=metadata_vars)


def error(tmp_path: Path, doc: object, *,
          env_vars: Mapping[str, str] = {}, metadata_vars: Mapping[str, str] = {}) -> str:
    with pytest.raises(BuildFileError) as info:
        load(tmp_path, doc, env_vars=env_vars, metadata_vars=metadata_vars)
    return str(info.value)


def touch(root: Path, *paths: str) -> None:
    for p in paths:
        (root / p).parent.mkdir(parents=True, exist_ok=True)
        (root / p).write_text(f"content of {p}\n")


def paths(root: Path, patterns: list[str]) -> list[str]:
    return [f.path for f in select_files(root, patterns)]


@pytest.mark.parametrize("name", ["agentuity-snapshot.yaml", "agentuity-snapshot.json"])
def test_valid_file(tmp_path: Path, name: str) -> None:
    spec = load(tmp_path, VALID, name, env_vars={"SECRET": "s3"}, metadata_vars={"VERSION": "1.2"})
    assert spec == BuildSpec(
        runtime="bun:1", name="my-snap_1", description="A snapshot", dir=None,
        dependencies=("curl", "git=1:2.39.2-1"), packages=("typescript", "zod@3"),
        files=("*.js", "src/**", "!**/*.test.js"),
        env={"NODE_ENV": "production", "API_KEY": "key-s3"}, metadata={"version": "1.2"}, public=True,
    )


def test_minimal_file_defaults(tmp_path: Path) -> None:
    spec = load(tmp_path, {"version": 1, "runtime": "python:3.13", "dependencies": ["curl"]})
    assert (spec.name, spec.files, spec.env, spec.metadata, spec.public) == (None, (), {}, {}, False)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"version": None}, "agentuity-snapshot.yaml: version: is required"),
        ({"version": 2}, "agentuity-snapshot.yaml: version: 2 is not supported"),
        ({"version": "1"}, "version: '1' is not supported"),
        ({"version": True}, "version: True is not supported"),
        ({"runtime": None}, "runtime: is required"),
        ({"runtime": ""}, "runtime: '' must be a runtime name"),
        ({"name": "bad name!"}, "agentuity-snapshot.yaml: name: 'bad name!' may only hold letters, digits, _ and -"),
        ({"colour": "blue"}, "colour: 'blue' is not a known field"),
        ({"packages": ["left-pad; rm -rf /"]}, "packages[0]: 'left-pad; rm -rf /' must be a registry package"),
        ({"packages": "typescript"}, "packages: 'typescript' must be a list of strings"),
        ({"files": False}, "files: False must be a list of strings"),
        ({"env": ["A=1"]}, "env: ['A=1'] must be a mapping"),
        ({"dependencies": ["curl", "Curl && true"]}, "dependencies[1]: 'Curl && true' must be an apt package"),
        ({"env": {"PORT": 8080}}, "env.PORT: 8080 must be a string"),
        ({"env": {"BAD-KEY": "x"}}, "env: 'BAD-KEY' is not a valid key"),
        ({"env": {"TOKEN": "${MISSING}"}}, "env.TOKEN: '${MISSING}' uses ${MISSING}, which is not set (pass --env MISSING=...)"),
        ({"metadata": {"v": "${VERSION}"}}, "metadata.v: '${VERSION}' uses ${VERSION}, which is not set (pass --metadata"),
        ({"public": "yes"}, "public: 'yes' must be true or false"),
        ({"dir": "../elsewhere"}, "dir: '../elsewhere' must be a relative path inside"),
        ({"dir": "/abs"}, "dir: '/abs' must be a relative path inside"),
        ({"files": ["../secrets/*"]}, "files[0]: '../secrets/*' must stay inside the build context"),
        ({"files": [""]}, "files[0]: '' must be a non-empty glob pattern"),
    ],
)
def test_validation_errors(tmp_path: Path, change: dict, expected: str) -> None:
    doc = {**VALID, **change}
    doc = {k: v for k, v in doc.items() if v is not None}
    # metadata's ${VERSION} only resolves when the case is not about it
    vars_ = {"env_vars": {"SECRET": "s"}, "metadata_vars": {} if "metadata" in change else {"VERSION": "1"}}
    assert expected in error(tmp_path, doc, **vars_)


def test_all_empty_is_an_error(tmp_path: Path) -> None:
    doc = {"version": 1, "runtime": "bun:1", "name": "x", "dependencies": [], "files": [], "env": {}}
    assert "at least one of dependencies, files, env or packages" in error(tmp_path, doc)


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    (tmp_path / "agentuity-snapshot.yaml").write_text("version: [1\n")
    with pytest.raises(BuildFileError, match=r"agentuity-snapshot\.yaml: cannot read"):
        load_build_file(tmp_path / "agentuity-snapshot.yaml")
    (tmp_path / "agentuity-snapshot.json").write_text("[1, 2]")
    with pytest.raises(BuildFileError, match="must be a mapping"):
        load_build_file(tmp_path / "agentuity-snapshot.json")


def test_find_build_file_preference(tmp_path: Path) -> None:
    for name in ("hutch-snapshot.yaml", "agentuity-snapshot.json", "agentuity-snapshot.yml"):
        (tmp_path / name).write_text("{}")
        assert find_build_file(tmp_path).name == name
    (tmp_path / "agentuity-snapshot.yaml").write_text("{}")
    assert find_build_file(tmp_path) == tmp_path / "agentuity-snapshot.yaml"
    explicit = tmp_path / "custom.yaml"
    explicit.write_text("{}")
    assert find_build_file(tmp_path, str(explicit)) == explicit


def test_find_build_file_missing(tmp_path: Path) -> None:
    with pytest.raises(BuildFileError, match=r"no build file; expected one of agentuity-snapshot\.yaml"):
        find_build_file(tmp_path)
    with pytest.raises(BuildFileError, match="build file not found"):
        find_build_file(tmp_path, str(tmp_path / "nope.yaml"))
    with pytest.raises(BuildFileError, match="build directory not found"):
        find_build_file(tmp_path / "absent")


def test_resolve_context(tmp_path: Path) -> None:
    (tmp_path / "app").mkdir()
    assert resolve_context(tmp_path, BuildSpec(runtime="bun:1", dir="app")) == (tmp_path / "app").resolve()
    assert resolve_context(tmp_path, BuildSpec(runtime="bun:1")) == tmp_path.resolve()
    (tmp_path / "escape").symlink_to(tmp_path.parent)
    for bad in ("escape", "missing"):
        with pytest.raises(BuildFileError, match=f"dir: '{bad}'"):
            resolve_context(tmp_path, BuildSpec(runtime="bun:1", dir=bad))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "ctx"
    touch(root, "index.js", "util.test.js", "README.md", ".env", "src/app.js", "src/app.test.js",
          "src/deep/x.ts", "src/.hidden", "lib/a.js", "lib/b/c.js", "node_modules/pkg/index.js", ".git/HEAD")
    return root


def test_select_top_level_glob(tree: Path) -> None:
    assert paths(tree, ["*.js"]) == ["index.js", "util.test.js"]


def test_select_double_star_and_exclusions(tree: Path) -> None:
    assert paths(tree, ["*.js", "src/**", "!**/*.test.js", "!node_modules/**"]) == [
        "index.js", "src/app.js", "src/deep/x.ts"]
    assert paths(tree, ["**/*.js", "!node_modules/**"]) == [
        "index.js", "lib/a.js", "lib/b/c.js", "src/app.js", "src/app.test.js", "util.test.js"]
    assert paths(tree, ["lib/**/*.js"]) == ["lib/a.js", "lib/b/c.js"]
    assert paths(tree, ["src/*.js", "?ndex.js", "[iu]*.js", "!util*", "!*/*.test.*"]) == ["index.js", "src/app.js"]


def test_select_plain_directory_and_file(tree: Path) -> None:
    assert paths(tree, ["lib", "README.md"]) == ["README.md", "lib/a.js", "lib/b/c.js"]
    assert paths(tree, ["**", "!lib", "!src", "!node_modules"]) == ["README.md", "index.js", "util.test.js"]


def test_dotfiles_need_an_explicit_dot(tree: Path) -> None:
    assert ".env" not in paths(tree, ["*"]) and ".git/HEAD" not in paths(tree, ["**"])
    assert paths(tree, [".env", "src/.*"]) == [".env", "src/.hidden"]
    assert paths(tree, ["**/.*", "!**/.hidden"]) == [".env"]  # exclusions do match dotfiles


def test_selected_file_details(tree: Path) -> None:
    (tree / "run.sh").write_text("echo hi\n")
    (tree / "run.sh").chmod(0o750)
    [f] = select_files(tree, ["run.sh"])
    assert (f.path, f.size, f.mode, f.source) == ("run.sh", 8, 0o750, (tree / "run.sh").resolve())
    assert f.sha256 == hashlib.sha256(b"echo hi\n").hexdigest()


@pytest.mark.parametrize("bad", ["../x", "src/../../x", "/etc/passwd", "!../x", "C:/x", "**/..", ""])
def test_escaping_patterns_refused(tree: Path, bad: str) -> None:
    with pytest.raises(BuildFileError, match="files: "):
        select_files(tree, [bad])


def test_symlinks(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret")
    (tree / "inside.js").symlink_to(tree / "lib" / "a.js")
    (tree / "src" / "linked").symlink_to(tree / "lib")
    [f] = select_files(tree, ["inside.js"])
    assert f.source == (tree / "lib" / "a.js").resolve() and f.size == len("content of lib/a.js\n")
    assert paths(tree, ["src/linked/**"]) == ["src/linked/a.js", "src/linked/b/c.js"]

    (tree / "leak.txt").symlink_to(tmp_path / "outside.txt")
    (tree / "node_modules" / "store").symlink_to(tmp_path)
    for pattern in ("*.txt", "**", "node_modules/store/**"):
        with pytest.raises(BuildFileError, match="outside the build context"):
            select_files(tree, [pattern])
    (tree / "dangling").symlink_to(tree / "nope")
    with pytest.raises(BuildFileError, match="'dangling' is a dangling symlink"):
        select_files(tree, ["dangl*"])
    # not selected, or under an excluded directory: no concern
    assert paths(tree, ["*.js", "!node_modules/**"]) == ["index.js", "inside.js", "util.test.js"]
    assert paths(tree, ["**", "!*.txt", "!dangling", "!node_modules"])[0] == "README.md"


def test_symlink_loop(tree: Path) -> None:
    (tree / "src" / "loop").symlink_to(tree / "src")
    with pytest.raises(BuildFileError, match="symlink loop"):
        select_files(tree, ["src/**"])


def test_content_hash(tree: Path) -> None:
    spec = BuildSpec(runtime="bun:1", files=("**",))
    files = select_files(tree, ["**"])
    h = content_hash(spec, files)
    assert len(h) == 64 and h == content_hash(spec, list(reversed(files)))
    os.utime(tree / "index.js", (1, 1))
    assert content_hash(spec, select_files(tree, ["**"])) == h  # mtimes do not count

    (tree / "index.js").chmod(0o700)
    assert content_hash(spec, select_files(tree, ["**"])) != h
    (tree / "index.js").chmod(0o644)
    (tree / "index.js").write_text("changed")
    changed = content_hash(spec, select_files(tree, ["**"]))
    assert changed != h
    assert content_hash(BuildSpec(runtime="bun:1", files=("**",), env={"A": "1"}), select_files(tree, ["**"])) != changed
    assert content_hash(BuildSpec(runtime="bun:2", files=("**",)), select_files(tree, ["**"])) != changed
    assert content_hash(spec, select_files(tree, ["**", "!README.md"])) != changed


def test_write_archive_round_trip(tree: Path) -> None:
    (tree / "index.js").chmod(0o755)
    files = select_files(tree, ["**"])
    out = io.BytesIO()
    write_archive(files, out)
    again = io.BytesIO()
    write_archive(files, again)
    assert out.getvalue() == again.getvalue()  # deterministic, byte for byte

    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:gz") as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [f.path for f in files]
        for m, f in zip(members, files, strict=True):
            assert m.isreg() and (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
            assert m.mode == f.mode and m.size == f.size
            member = tar.extractfile(m)
            assert member is not None and member.read() == f.source.read_bytes()
    assert members[[m.name for m in members].index("index.js")].mode == 0o755


def test_write_archive_refuses_changed_file(tree: Path) -> None:
    files = select_files(tree, ["index.js"])
    (tree / "index.js").write_text("content of index.jz\n")  # same size, other content
    with pytest.raises(BuildFileError, match="changed while"):
        write_archive(files, io.BytesIO())
    (tree / "index.js").write_text("longer than it was before\n")
    with pytest.raises(BuildFileError, match="changed while"):
        write_archive(files, io.BytesIO())
    (tree / "index.js").write_text("short")
    with pytest.raises(BuildFileError, match="changed while"):
        write_archive(files, io.BytesIO())


def test_template_yaml_parses_back(tmp_path: Path) -> None:
    text = template()
    assert text.count("#") > 10
    path = tmp_path / "agentuity-snapshot.yaml"
    path.write_text(text)
    spec = load_build_file(path, env_vars={"SECRET_KEY": "k"}, metadata_vars={"VERSION": "2"})
    assert (spec.runtime, spec.dependencies, spec.env, spec.metadata) == (
        "bun:1", ("curl",), {"NODE_ENV": "production", "API_KEY": "k"}, {"version": "2"})
    assert spec.files == ("*.js", "src/**", "!**/*.test.js", "!node_modules/**")


def test_template_json_parses_back(tmp_path: Path) -> None:
    doc = json.loads(template("json"))
    assert doc == yaml.safe_load(template("yaml"))
    path = tmp_path / "agentuity-snapshot.json"
    path.write_text(template("json"))
    assert load_build_file(path, env_vars={"SECRET_KEY": "k"}, metadata_vars={"VERSION": "2"}).name == "my-snapshot"
    with pytest.raises(BuildFileError, match="'toml' is not supported"):
        template("toml")
