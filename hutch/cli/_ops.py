"""Operator commands of the production profile: ``hutch projector``, ``hutch projections
rebuild`` and ``hutch audit``. They talk to the event log and the store directly (no server),
with the same settings as ``hutch serve`` (flags, else HUTCH_EVENT_LOG / HUTCH_STORE /
HUTCH_DATA_DIR)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any


def add_parsers(top: Any) -> None:
    projector = top.add_parser("projector", help="apply the event log to the projection store, as its own process")
    _log_and_store(projector)
    projector.set_defaults(handler=cmd_projector)

    projections = top.add_parser("projections", help="maintain the projection store")
    actions = projections.add_subparsers(dest="action", metavar="ACTION", parser_class=top._parser_class)
    actions.required = True
    rebuild = actions.add_parser("rebuild", help="replay the whole event log into a reset store")
    _log_and_store(rebuild)
    rebuild.set_defaults(handler=cmd_rebuild)

    audit = top.add_parser("audit", help="keep the append-only audit trail (a consumer group on Kafka)")
    _log_and_store(audit, store_help="postgresql://… to keep the trail in (HUTCH_AUDIT_STORE, else HUTCH_STORE)")
    audit.add_argument("--jsonl", metavar="PATH", help="also (or only) append the trail to this JSONL file")
    audit.add_argument("--group", default=None, help="Kafka consumer group (HUTCH_AUDIT_GROUP, default hutch-audit)")
    audit.add_argument("--org", metavar="ORG_ID",
                       help="keep only this organization's records (a per-tenant trail; use its own --group)")
    audit.add_argument("--until-caught-up", action="store_true",
                       help="exit once the log present at start is written (default: follow forever)")
    audit.set_defaults(handler=cmd_audit)


def _log_and_store(p: argparse.ArgumentParser, store_help: str = "postgresql://… (HUTCH_STORE)") -> None:
    p.add_argument("--event-log", metavar="URL", help="sqlite | sqlite:///path | kafka://HOST:PORT/TOPIC (HUTCH_EVENT_LOG)")
    p.add_argument("--store", metavar="URL", help=store_help)
    p.add_argument("--data-dir", help="state directory (HUTCH_DATA_DIR)")


def _settings(args: argparse.Namespace) -> tuple[str, str, Path]:
    from hutch.cli._common import UsageError
    from hutch.service.config import Config
    from hutch.service.extras import missing_message

    config = Config.from_env(event_log=args.event_log, store=args.store, data_dir=args.data_dir)
    if (missing := missing_message(config)) is not None:
        raise UsageError(missing)
    return config.event_log, config.store, config.data_dir


def _logging() -> None:
    logging.basicConfig(level=os.environ.get("HUTCH_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def cmd_projector(args: argparse.Namespace) -> int:
    from hutch.service.composition import open_persistent_store
    from hutch.service.ops import run_projector, until_signalled

    event_log, store, data_dir = _settings(args)
    open_persistent_store(store)  # refuse a non-persistent store before connecting to anything
    _logging()
    asyncio.run(until_signalled(lambda: run_projector(event_log, store, data_dir)))
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from hutch.service.ops import rebuild

    event_log, store, data_dir = _settings(args)
    _logging()
    result = asyncio.run(rebuild(event_log, store, data_dir))
    print(json.dumps(result))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from hutch.projections.audit import DEFAULT_GROUP
    from hutch.service.ops import run_audit, until_signalled

    event_log, store, data_dir = _settings(args)
    store = args.store or os.environ.get("HUTCH_AUDIT_STORE") or store
    audit_store = store if store.startswith(("postgresql://", "postgres://")) else None
    group = args.group or os.environ.get("HUTCH_AUDIT_GROUP") or DEFAULT_GROUP
    jsonl = Path(args.jsonl) if args.jsonl else None
    _logging()
    written: list[int] = []

    async def work() -> None:
        written.append(await run_audit(event_log, data_dir, store_url=audit_store, jsonl=jsonl, group=group,
                                       until_caught_up=args.until_caught_up, org=args.org))

    asyncio.run(until_signalled(work))
    if written:
        print(json.dumps({"written": written[0]}))
    return 0
