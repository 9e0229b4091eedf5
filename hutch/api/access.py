"""What each route needs: a key that may read, one that may write, or none (``PUBLIC``). The
auth middleware (api/app.py) and the OpenAPI document (api/openapi.py) read the marks."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from hutch.core.tenancy import Access

Handler = Callable[..., Awaitable[Any]]
PUBLIC = "public"  # no key: the path or a token in it is the capability (streams, port URLs)


def needs(access: Access | str) -> Callable[[Handler], Handler]:
    """Declare what a handler needs, where the method alone would say wrong (see ``access_of``)."""

    def mark(handler: Handler) -> Handler:
        handler.hutch_access = access  # type: ignore[attr-defined]  # a mark access_of reads
        return handler

    return mark


def access_of(method: str, handler: Any) -> Access | str:
    """A handler's declared access, else by method: reads are GET/HEAD, everything else writes."""
    declared = getattr(handler, "hutch_access", None)
    if declared is not None:
        return declared
    return Access.READ if method in ("GET", "HEAD") else Access.WRITE
