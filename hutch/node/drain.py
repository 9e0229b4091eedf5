"""The agent's drain flag: set by the operator through the API (``hutch node drain``), kept
in the data dir so a restart of the agent does not quietly put the node back in service, and
reported in every capacity answer. A draining agent refuses new sandboxes itself too, so an
API replica that has not read it yet places elsewhere (NodeFull) instead of here."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from aiohttp import web

from hutch.core.errors import InvalidInput

log = logging.getLogger(__name__)
FILE = "drain.json"


class Drain:
    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / FILE
        self.draining = False
        try:
            self.draining = bool(json.loads(self._path.read_text()).get("draining"))
        except FileNotFoundError:
            pass
        except (ValueError, AttributeError) as err:
            # A flag that cannot be read is taken as set: placing on a node its operator drained
            # is the worse mistake. Said in the log; `hutch node drain --undo` rewrites it.
            self.draining = True
            log.warning("%s is unreadable (%s): draining until told otherwise",
                                                self._path, err)

    def set(self, draining: bool) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"draining": draining}))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        tmp.replace(self._path)  # whole or not at all, across a crash
        self.draining = draining


DRAIN = web.AppKey("drain", Drain)


async def set_drain(request: web.Request) -> web.Response:
    body = await request.json()
    draining = body.get("draining") if isinstance(body, dict) else None
    if not isinstance(draining, bool):
        raise InvalidInput(f"draining: expected true or false, got {draining!r}", field="draining")
    request.app[DRAIN].set(draining)
    return web.json_response({"draining": draining})


def add_routes(app: web.Application, data_dir: Path) -> None:
    app[DRAIN] = Drain(data_dir)
    app.router.add_post("/v1/node/drain", set_drain)
