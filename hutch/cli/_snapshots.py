"""`hutch sandbox snapshot|snap …`: create, list, get, tag, delete, lineage, build, generate."""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

from hutch.cli import _render as render
from hutch.cli._common import UsageError, _call, _json_flag, _note, _out, _Parser
from hutch.cli._values import env_pair
from hutch.client import SandboxClient
from hutch.models import SandboxList, Snapshot, SnapshotLineageEntry, to_wire
from hutch.snapshot_build import (
    BuildFileError,
    content_hash,
    find_build_file,
    load_build_file,
    resolve_context,
    select_files,
    template,
    write_archive,
)

_SORTS = ("name", "created", "size", "files")


def add_parsers(sb: Any) -> None:
    snap = sb.add_parser("snapshot", aliases=["snap"], help="snapshots: reusable bases for new sandboxes")
    sp = snap.add_subparsers(dest="snapshot_action", metavar="ACTION", parser_class=_Parser)
    sp.required = True

    create = sp.add_parser("create", aliases=["new"], help="snapshot a sandbox's workspace, env and runtime")
    create.add_argument("sandbox_id", metavar="SANDBOX_ID")
    create.add_argument("--name", help="snapshot name (letters, digits, _ and -); default: the sandbox's name or id")
    create.add_argument("--description", help="snapshot description")
    create.add_argument("--tag", help="snapshot tag (default: latest); the tag moves off any older snapshot of the name")
    create.add_argument("--public", action="store_true", help="make the snapshot readable without a key")
    _json_flag(create)
    create.set_defaults(handler=cmd_create)

    ls = sp.add_parser("list", aliases=["ls"], help="list snapshots")
    ls.add_argument("--sandbox", metavar="SANDBOX_ID", help="only snapshots taken from this sandbox")
    ls.add_argument("--limit", type=int, help="max results")
    ls.add_argument("--offset", type=int, help="pagination offset")
    ls.add_argument("--sort", choices=_SORTS, help="sort by name, created, size or files (default: created)")
    ls.add_argument("--direction", choices=("asc", "desc"), help="sort direction (default: desc)")
    ls.add_argument("--forks", action="store_true", help="also the snapshots forks keep of their instant")
    _json_flag(ls)
    ls.set_defaults(handler=cmd_list)

    get = sp.add_parser("get", aliases=["show", "info"], help="one snapshot: size, files, tag, sandboxes made from it")
    get.add_argument("snapshot", metavar="SNAPSHOT", help="an id (snp_...), name:tag or tag")
    _json_flag(get)
    get.set_defaults(handler=cmd_get)

    tag = sp.add_parser("tag", help="tag a snapshot, or --clear its tag")
    tag.add_argument("snapshot_id", metavar="SNAPSHOT_ID")
    tag.add_argument("tag", metavar="TAG", nargs="?")
    tag.add_argument("--clear", action="store_true", help="remove the tag")
    _json_flag(tag)
    tag.set_defaults(handler=cmd_tag)

    delete = sp.add_parser("delete", aliases=["rm", "del"], help="delete a snapshot")
    delete.add_argument("snapshot_id", metavar="SNAPSHOT_ID")
    delete.add_argument("--confirm", action="store_true", help="accepted for compatibility; deletes never prompt")
    _json_flag(delete)
    delete.set_defaults(handler=cmd_delete)

    lineage = sp.add_parser("lineage", help="a snapshot and its ancestors, newest first")
    lineage.add_argument("snapshot", metavar="SNAPSHOT", nargs="?", help="an id (snp_...) or name:tag")
    lineage.add_argument("--name", help="start from the newest snapshot of this name")
    lineage.add_argument("--tag", help="with --name: start from name:tag")
    lineage.add_argument("--limit", type=int, help="at most this many entries (max 1000)")
    _json_flag(lineage)
    lineage.set_defaults(handler=cmd_lineage)
    _build_parsers(sp)


def _build_parsers(sp: Any) -> None:
    """``snapshot build`` (from a declarative file) and ``snapshot generate`` (a starter file)."""
    build = sp.add_parser("build", help="build a snapshot from a declarative file (agentuity-snapshot.yaml)")
    build.add_argument("directory", metavar="DIRECTORY")
    build.add_argument("--file", help="the build file (default: agentuity-snapshot.{yaml,yml,json} in DIRECTORY)")
    build.add_argument("--tag", help="snapshot tag (default: latest)")
    build.add_argument("--name", help="snapshot name (overrides the build file)")
    build.add_argument("--description", help="description (overrides the build file)")
    build.add_argument("--message", help="a build message, kept with the snapshot")
    build.add_argument("--env", type=env_pair, action="append", default=[], metavar="KEY=VALUE",
                       help="fills ${KEY} in the file's env (repeatable)")
    build.add_argument("--metadata", type=env_pair, action="append", default=[], metavar="KEY=VALUE",
                       help="fills ${KEY} in the file's metadata (repeatable)")
    build.add_argument("--force", action="store_true", help="build even if the content is unchanged")
    build.add_argument("--public", action="store_true", help="make the snapshot readable without a key")
    build.add_argument("--confirm", action="store_true", help="accepted for compatibility (public builds)")
    _json_flag(build)
    build.set_defaults(handler=cmd_build)

    generate = sp.add_parser("generate", help="print a commented starter build file")
    generate.add_argument("--format", choices=("yaml", "json"), default="yaml")
    generate.set_defaults(handler=cmd_generate)


def _show(snap: Snapshot, out: Any) -> None:
    render.key_values([
        ("id", snap.snapshot_id), ("name", snap.full_name or snap.name), ("tag", snap.tag or "-"),
        ("runtime", snap.runtime or snap.runtime_id), ("size", f"{snap.size_bytes} bytes"), ("files", snap.file_count),
        ("description", snap.description), ("message", snap.message), ("parent", snap.parent_snapshot_id),
        ("source sandbox", snap.source_sandbox_id), ("public", snap.public), ("created", snap.created_at),
    ], out)


def cmd_create(args: argparse.Namespace) -> int:
    snap = _call(args, lambda c: c.create_snapshot(
        args.sandbox_id, name=args.name, tag=args.tag, description=args.description, public=args.public or None))
    if args.json:
        render.dump_json(to_wire(snap), _out())
    else:
        _out().write(f"{snap.snapshot_id}\n")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    found: list[Snapshot]  # spelled out: hutch.client's own annotation reads `list` as its method
    found, total = _call(args, lambda c: c.list_snapshots(
        sandbox_id=args.sandbox, limit=args.limit, offset=args.offset, sort=args.sort, direction=args.direction,
        forks=args.forks))
    if args.json:
        render.dump_json({"snapshots": [to_wire(s) for s in found], "total": total}, _out())
        return 0
    if not found:
        _out().write("no snapshots\n")
        return 0
    render.table(("ID", "NAME", "TAG", "SIZE", "FILES", "CREATED"),
                 [(s.snapshot_id, s.name, s.tag or "-", s.size_bytes, s.file_count, s.created_at) for s in found],
                 _out())
    if total > len(found):
        _out().write(f"({len(found)} of {total})\n")
    return 0


def cmd_get(args: argparse.Namespace) -> int:
    async def work(c: SandboxClient) -> tuple[Snapshot, SandboxList]:
        snap = await c.get_snapshot(args.snapshot)
        made = await c.list(snapshot_id=snap.snapshot_id, limit=100)
        return snap, made
    snap, made = _call(args, work)
    if args.json:
        render.dump_json({**to_wire(snap), "sandboxes": [s.sandbox_id for s in made.sandboxes]}, _out())
        return 0
    out = _out()
    _show(snap, out)
    if snap.files:
        out.write("files:\n")
        for f in snap.files:
            out.write(f"  {f.path}  {f.size}  {oct(f.mode)[2:]}\n")
    ids = [s.sandbox_id for s in made.sandboxes]
    out.write(f"sandboxes made from it: {', '.join(ids) if ids else 'none'}\n")
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    if args.clear == (args.tag is not None):
        raise UsageError("give a TAG or --clear (one of them)")
    snap = _call(args, lambda c: c.tag_snapshot(args.snapshot_id, None if args.clear else args.tag))
    if args.json:
        render.dump_json(to_wire(snap), _out())
    else:
        _out().write(f"{snap.snapshot_id} tag {snap.tag or 'cleared'}\n")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    _call(args, lambda c: c.delete_snapshot(args.snapshot_id))
    if args.json:
        render.dump_json({"deleted": args.snapshot_id}, _out())
    else:
        _out().write(f"deleted {args.snapshot_id}\n")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    if bool(args.snapshot) == bool(args.name):
        raise UsageError("give a SNAPSHOT or --name (one of them)")
    if args.tag and not args.name:
        raise UsageError("--tag goes with --name")
    chain: list[SnapshotLineageEntry] = _call(args, lambda c: c.snapshot_lineage(
        snapshot=args.snapshot, name=args.name, tag=args.tag, limit=args.limit))
    if args.json:
        render.dump_json([to_wire(e) for e in chain], _out())
        return 0
    render.table(("ID", "NAME", "TAG", "CREATED", "DELETED"),
                 [(e.snapshot_id, e.name, e.tag or "-", e.created_at, "yes" if e.deleted else "") for e in chain],
                 _out())
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    try:
        path = find_build_file(args.directory, args.file)
        spec = load_build_file(path, env_vars=dict(args.env), metadata_vars=dict(args.metadata))
        context = resolve_context(args.directory, spec)
        files = select_files(context, spec.files)
    except BuildFileError as err:
        raise UsageError(str(err)) from err
    digest = content_hash(spec, files)
    total = sum(f.size for f in files)
    _note(f"[1/4] {path.name}: runtime {spec.runtime}, {len(files)} files ({_size(total)}), "
              f"{len(spec.dependencies)} dependencies, {len(spec.packages)} packages")
    with tempfile.TemporaryFile(prefix="hutch-snapshot-") as archive:
        if files:
            try:
                write_archive(files, archive)
            except BuildFileError as err:
                raise UsageError(str(err)) from err
            _note(f"[2/4] archive: {_size(archive.tell())} (content hash {digest[:12]})")
            archive.seek(0)
        else:
            _note("[2/4] no files to archive")
        steps = iter(("[3/4] ", "[3/4] ", "[4/4] "))
        snap, new = _call(args, lambda c: c.build_snapshot(
            spec.runtime, archive if files else None, name=args.name or spec.name, tag=args.tag,
            description=args.description or spec.description, message=args.message, content_hash=digest,
            force=args.force, public=args.public or spec.public, env=spec.env, metadata=spec.metadata,
            dependencies=spec.dependencies, packages=spec.packages,
            progress=lambda m: _note(next(steps, "") + m)))
    if args.json:
        render.dump_json({**to_wire(snap), "unchanged": not new}, _out())
        return 0
    if not new:
        _out().write(f"unchanged: {snap.snapshot_id} ({snap.name}:{snap.tag or '-'}); --force to rebuild\n")
        return 0
    _out().write(f"{snap.snapshot_id}\n")
    _show(snap, _out())
    return 0


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def cmd_generate(args: argparse.Namespace) -> int:
    _out().write(template(args.format))
    return 0

