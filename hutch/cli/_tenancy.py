"""`hutch org …`, `hutch project …`, `hutch key …`: organizations, projects, API keys, quotas.

``--org ORG_ID`` picks the organization a command acts in (the server's administrator may act
for any; other keys for their own only); without it, the key's own organization.
"""

from __future__ import annotations

import argparse
from typing import Any

from hutch.cli import _render as render
from hutch.cli._common import _call, _json_flag, _out, _Parser
from hutch.models import to_wire


def add_parsers(top: Any) -> None:
    org = top.add_parser("org", help="organizations (creating one: the server's administrator)")
    o = org.add_subparsers(dest="org_action", metavar="ACTION", parser_class=_Parser)
    o.required = True
    p = o.add_parser("create", aliases=["new"], help="org create NAME (its id is org_NAME)")
    p.add_argument("name", metavar="NAME", help="lower-case letters, digits and -")
    _json_flag(p)
    p.set_defaults(handler=cmd_org_create)
    p = o.add_parser("list", aliases=["ls"], help="the organizations this key may act for")
    _json_flag(p)
    p.set_defaults(handler=cmd_org_list)
    p = o.add_parser("get", aliases=["show"], help="org get ORG_ID: its quota and what it uses")
    p.add_argument("org_ref", metavar="ORG_ID")
    _json_flag(p)
    p.set_defaults(handler=cmd_org_get)
    p = o.add_parser("quota", help="org quota ORG_ID [--sandboxes N] [--memory 8Gi] [--cpu 4000m] "
                                   "[--snapshots 10Gi] (none lifts a limit)")
    p.add_argument("org_ref", metavar="ORG_ID")
    for flag, what in (("--sandboxes", "concurrent live sandboxes"), ("--memory", "total memory of live sandboxes"),
                       ("--cpu", "total CPU of live sandboxes (1000m = one core)"),
                       ("--snapshots", "bytes of snapshots kept")):
        p.add_argument(flag, metavar="LIMIT", help=what + "; 'none' lifts it")
    _json_flag(p)
    p.set_defaults(handler=cmd_org_quota)

    project = top.add_parser("project", help="projects of an organization")
    pr = project.add_subparsers(dest="project_action", metavar="ACTION", parser_class=_Parser)
    pr.required = True
    p = pr.add_parser("create", aliases=["new"], help="project create NAME [--org ORG_ID]")
    p.add_argument("name", metavar="NAME")
    _org_flag(p)
    _json_flag(p)
    p.set_defaults(handler=cmd_project_create)
    p = pr.add_parser("list", aliases=["ls"], help="project list [--org ORG_ID]")
    _org_flag(p)
    _json_flag(p)
    p.set_defaults(handler=cmd_project_list)

    key = top.add_parser("key", help="API keys (admins of an organization)")
    k = key.add_subparsers(dest="key_action", metavar="ACTION", parser_class=_Parser)
    k.required = True
    p = k.add_parser("create", aliases=["new"], help="a key; its secret is printed once")
    _org_flag(p)
    p.add_argument("--role", required=True, choices=("admin", "member", "read-only"))
    p.add_argument("--project", action="append", metavar="PROJECT", help="limit it to a project (repeatable)")
    p.add_argument("--expires", metavar="WHEN", help="30d, 12h, 90m or an ISO-8601 time")
    p.add_argument("--name", help="what the key is for")
    p.add_argument("--rate", type=float, metavar="PER_SECOND", help="requests a second it may make")
    p.add_argument("--burst", type=int, metavar="N", help="requests it may make at once (default 2x rate)")
    _json_flag(p)
    p.set_defaults(handler=cmd_key_create)
    p = k.add_parser("list", aliases=["ls"], help="key list [--org ORG_ID] (never the secrets)")
    _org_flag(p)
    _json_flag(p)
    p.set_defaults(handler=cmd_key_list)
    p = k.add_parser("revoke", aliases=["rm", "delete"], help="key revoke KEY_ID: refused from then on")
    p.add_argument("key_id", metavar="KEY_ID")
    _org_flag(p)
    _json_flag(p)
    p.set_defaults(handler=cmd_key_revoke)


def _org_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--org", metavar="ORG_ID", help="the organization to act in (default: the key's own)")


def _limit(value: str | None, field: str) -> int | None:
    from hutch.core.quantities import parse_bytes, parse_millicores

    if value is None or value.lower() == "none":
        return None
    if field == "memory_bytes" or field == "snapshot_bytes":
        return parse_bytes(field, value)
    if field == "cpu_millis":
        return parse_millicores(field, value)
    return int(value)


def _show(obj: Any, line: str, args: argparse.Namespace) -> int:
    if args.json:
        render.dump_json(to_wire(obj), _out())
    else:
        _out().write(line + "\n")
    return 0


def cmd_org_create(args: argparse.Namespace) -> int:
    org = _call(args, lambda c: c.tenancy.create_org(args.name))
    return _show(org, org.id, args)


def cmd_org_list(args: argparse.Namespace) -> int:
    orgs = _call(args, lambda c: c.tenancy.list_orgs())
    if args.json:
        render.dump_json([to_wire(o) for o in orgs], _out())
        return 0
    for o in orgs:
        _out().write(f"{o.id}  {o.name}  {o.created_at}\n")
    return 0


def _quota_line(q: Any) -> str:
    return " ".join(f"{k}={getattr(q, k) if getattr(q, k) is not None else '-'}"
                    for k in ("sandboxes", "memory_bytes", "cpu_millis", "snapshot_bytes"))


def cmd_org_get(args: argparse.Namespace) -> int:
    org = _call(args, lambda c: c.tenancy.get_org(args.org_ref))
    return _show(org, f"{org.id}  {org.name}\n  quota: {_quota_line(org.quota)}\n  usage: "
                      f"{_quota_line(org.usage) if org.usage else '-'}", args)


def cmd_org_quota(args: argparse.Namespace) -> int:
    limits: dict[str, int | None] = {}
    for flag, field in (("sandboxes", "sandboxes"), ("memory", "memory_bytes"), ("cpu", "cpu_millis"),
                        ("snapshots", "snapshot_bytes")):
        raw = getattr(args, flag)
        if raw is not None:
            limits[field] = _limit(raw, field)
    org = _call(args, lambda c: c.tenancy.set_quota(args.org_ref, **limits))
    return _show(org, f"{org.id} quota: {_quota_line(org.quota)}", args)


def cmd_project_create(args: argparse.Namespace) -> int:
    project = _call(args, lambda c: c.tenancy.create_project(args.name))
    return _show(project, project.id, args)


def cmd_project_list(args: argparse.Namespace) -> int:
    found = _call(args, lambda c: c.tenancy.list_projects())
    if args.json:
        render.dump_json([to_wire(p) for p in found], _out())
        return 0
    for p in found:
        _out().write(f"{p.id}  {p.name}  {p.org_id}\n")
    return 0


def cmd_key_create(args: argparse.Namespace) -> int:
    key = _call(args, lambda c: c.tenancy.create_key(args.role, name=args.name, projects=args.project,
                                                     expires=args.expires, rate=args.rate, burst=args.burst))
    if args.json:
        render.dump_json(to_wire(key), _out())
        return 0
    _out().write(f"{key.secret}\n")
    import sys

    sys.stderr.write(f"hutch: key {key.id} ({key.role} of {key.org_id}); the secret above is shown only now\n")
    return 0


def cmd_key_list(args: argparse.Namespace) -> int:
    found = _call(args, lambda c: c.tenancy.list_keys())
    if args.json:
        render.dump_json([to_wire(k) for k in found], _out())
        return 0
    for k in found:
        state = f"revoked {k.revoked_at}" if k.revoked_at else (f"expires {k.expires_at}" if k.expires_at else "active")
        _out().write(f"{k.id}  {k.prefix}…  {k.role}  {render.shown(k.name)}  {state}\n")
    return 0


def cmd_key_revoke(args: argparse.Namespace) -> int:
    key = _call(args, lambda c: c.tenancy.revoke_key(args.key_id))
    return _show(key, f"revoked {key.id}", args)
