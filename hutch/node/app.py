"""The agent's aiohttp application: the signature check on every request but ``/healthz``,
the error envelope, and the routes of each role (sandboxes.py, commands.py, files.py,
terminals.py, ports.py)."""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from hutch.core import phases
from hutch.core.errors import DriverFailure, HutchError, InvalidInput, Unauthorized
from hutch.drivers.local.driver import LocalDriver
from hutch.drivers.node import wire
from hutch.edge import phases as edge_phases
from hutch.node import commands, drain, files, ports, sandboxes, terminals, watches
from hutch.node.config import NodeSettings
from hutch.node.keys import (
    DRIVER,
    FINGERPRINT,
    INSTANCE,
    SETTINGS,
    STREAMED,
    VERIFIER,
    error_response,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        if request.path != "/healthz":
            # raw_path: the path and query exactly as signed, before any decoding or normalising
            t0 = phases.start()
            body = request.app[VERIFIER].verify(request.method, request.raw_path, request.headers)
            await _check_body(request, body)
            phases.end("agent: signature and body check", t0)
        return await handler(request)
    except web.HTTPException:
        raise
    except HutchError as err:
        return error_response(err)
    except (ValueError, KeyError, TypeError) as err:  # a body that is not what the route takes
        return error_response(InvalidInput(f"bad request to the node agent: {err}"))
    except Exception as err:  # the driver's own fault: logged whole here, named only by kind there
        # (its text can carry host paths and names, and the API may show it to a tenant)
        log.exception("node agent: %s %s failed", request.method, request.path)
        return error_response(DriverFailure(f"node agent {request.app[SETTINGS].name} failed ({type(err).__name__}); "
                                            "its log has the details"))


async def _check_body(request: web.Request, signed: str) -> None:
    if signed == wire.STREAM:
        if not (request.match_info.route.name or "").startswith(STREAMED):
            raise Unauthorized(f"{request.method} {request.path} takes no streamed body")
        return
    # read() keeps the body for the handler's json()
    if not hmac.compare_digest(signed, wire.body_digest(await request.read())):
        raise Unauthorized("the body is not the one that was signed")


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def hello(request: web.Request) -> web.Response:
    nonce = request.query.get("nonce", "")
    if len(nonce) < 16:
        raise Unauthorized("hello: a nonce of at least 16 characters is needed")
    name, instance, fingerprint = request.app[SETTINGS].name, request.app[INSTANCE], request.app[FINGERPRINT]
    secret = request.app[SETTINGS].secret
    return web.json_response({"name": name, "instance": instance, "fingerprint": fingerprint,
                              "proof": wire.hello_proof(secret, nonce, name, instance, fingerprint)})


def make_app(settings: NodeSettings, driver: LocalDriver, fingerprint: str, *, own_driver: bool = True) -> web.Application:
    """``fingerprint``: of the certificate the agent serves with (certificate.py)."""
    # JSON bodies: a batch of files arrives base64'd, as the API took it (its own cap is 64 MiB
    # of JSON), plus the agent's envelope; streamed bodies (files, tar, stdin) have no cap here.
    app = web.Application(middlewares=[edge_phases.request_middleware("agent: "), guard] if phases.ON else [guard], client_max_size=128 << 20)
    app[SETTINGS] = settings
    app[DRIVER] = driver
    app[VERIFIER] = wire.Verifier(settings.secret)
    app[INSTANCE] = secrets.token_hex(8)  # a new one per start: the driver sees a restart
    app[FINGERPRINT] = fingerprint
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/hello", hello)
    drain.add_routes(app, settings.data_dir)  # before the others: admission reads it
    for module in (sandboxes, commands, files, terminals, watches, ports):
        module.add_routes(app)

    if phases.ON:  # first, so it writes last: after the driver's own spans at shutdown
        app.cleanup_ctx.append(edge_phases.file_ctx(lambda app: app[SETTINGS].data_dir))
    if own_driver:
        # Its warm pool's spares are counted by the agent's admission (sandboxes.Admission).
        driver.count_spares(app[sandboxes.ADMISSION])

        async def driver_ctx(app: web.Application) -> AsyncIterator[None]:
            await driver.start()
            yield
            await driver.close()

        app.cleanup_ctx.append(driver_ctx)
    return app
