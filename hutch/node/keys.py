"""What the agent's route modules share with its application (app.py): the app keys, the
streamed-route prefix and the error envelope. Kept apart so the routes need not import the
application that imports them."""

from __future__ import annotations

from aiohttp import web

from hutch.core.errors import HutchError
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.node import wire
from hutch.node.config import NodeSettings

DRIVER = web.AppKey("driver", LocalDriver)
SETTINGS = web.AppKey("settings", NodeSettings)
VERIFIER = web.AppKey("verifier", wire.Verifier)
INSTANCE = web.AppKey("instance", str)
FINGERPRINT = web.AppKey("fingerprint", str)  # of the certificate it serves, proven at hello

STREAMED = "streamed:"  # the name prefix of the routes whose body is streamed (not hashed)


def error_response(err: HutchError) -> web.Response:
    return web.json_response(err.to_wire(), status=err.status or 500)
