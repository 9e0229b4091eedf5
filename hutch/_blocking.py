"""How the blocking facade (``hutch/sync.py``) is derived from the async client instead of
written twice: a :class:`_Portal` (an event loop on its own thread), :func:`blocking` /
:func:`blocking_iter`, which turn an async method into a blocking one with the same name,
parameters and docstring, and :func:`derive`, which gives a twin every such method of its
async class.

A twin derives from :class:`Facade`, holds ``_portal`` and ``aio`` (the async object it
fronts) and writes only what is its own (construction, closing, ``with``, properties);
``derive`` adds the rest, wrapping results that are themselves async objects (a ``Sandbox``
comes back as a ``SyncSandbox``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import re
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

__all__ = ["Blocking", "Facade", "async_methods", "blocking", "blocking_iter", "derive", "iterate"]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _Portal:
    """An event loop on its own thread; ``call`` runs a coroutine there and blocks for the result."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="hutch-sync", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("SyncSandboxClient is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            self._settle(timeout=10.0)
            raise

    def _settle(self, timeout: float) -> None:
        """Let cancelled work finish its cleanup (e.g. destroying a one-shot sandbox)."""

        async def wait_others() -> None:
            current = asyncio.current_task()
            others = {task for task in asyncio.all_tasks() if task is not current}
            if others:
                await asyncio.wait(others, timeout=timeout)

        with contextlib.suppress(Exception):  # cleanup is best effort
            asyncio.run_coroutine_threadsafe(wait_others(), self._loop).result(timeout + 1)

    def close(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
        if not self._loop.is_closed():
            self._loop.close()


class Blocking:
    """Every coroutine method of ``target``, called and waited for on the portal's loop
    (for objects whose methods need no wrapping: tenancy, terminals, workspaces)."""

    def __init__(self, portal: _Portal, target: object) -> None:
        self._portal = portal
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._portal.call(method(*args, **kwargs))

        call.__doc__ = method.__doc__
        return call


class Facade:
    """Base of the blocking twins: what their derived methods call through (``_portal``,
    ``aio``)."""

    _portal: _Portal
    aio: Any  # the async object this one fronts

    if TYPE_CHECKING:
        # The derived methods are set on the class when hutch/sync.py is imported, where a type
        # checker cannot see them: it takes any other name as Any.
        def __getattr__(self, name: str) -> Any: ...


def iterate(portal: _Portal, agen: AsyncIterator[T]) -> Iterator[T]:
    """Drive an async iterator on the portal's loop, one item per blocking call."""
    try:
        while True:
            try:
                yield portal.call(_next(agen))
            except StopAsyncIteration:
                return
    finally:
        aclose = getattr(agen, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(RuntimeError):
                portal.call(aclose())


async def _next(agen: AsyncIterator[T]) -> T:
    return await anext(agen)


def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    wrap: Callable[[_Portal, R], Any] | None = None,
    returns: Any = None,
) -> Callable[Concatenate[Facade, P], Any]:
    """``method`` of the async class, run on the facade's loop and waited for; its result
    passed through ``wrap(portal, result)`` when given (an async handle's blocking twin, which
    ``returns`` names)."""

    def call(self: Facade, /, *args: P.args, **kwargs: P.kwargs) -> Any:
        result = self._portal.call(method(self.aio, *args, **kwargs))
        return result if wrap is None else wrap(self._portal, result)

    if wrap is None:
        returns = inspect.signature(method).return_annotation
    return _like(call, method, returns)


def blocking_iter(
    method: Callable[Concatenate[Any, P], AsyncIterator[T]],
) -> Callable[Concatenate[Facade, P], Iterator[T]]:
    """``method`` (returning an async iterator) as a blocking iterator: each item is fetched
    on the facade's loop as the caller asks for it; errors come on the first ``next``."""

    def call(self: Facade, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return iterate(self._portal, method(self.aio, *args, **kwargs))

    returns = inspect.signature(method).return_annotation
    if isinstance(returns, str) and returns.startswith("AsyncIterator["):
        returns = returns.removeprefix("Async")
    return _like(call, method, returns)


def async_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The public methods of ``cls`` a blocking twin has: coroutines, async generators, and
    plain methods returning an async iterator (``Sandbox.read_file``)."""
    found: dict[str, Callable[..., Any]] = {}
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_") and (inspect.iscoroutinefunction(member) or _iterates(member)):
            found[name] = member
    return found


def derive(twins: Mapping[type, type[Facade]], *, also: Mapping[str, type] | None = None) -> None:
    """Give each blocking twin (``twins``: async class -> its twin) a blocking method for every
    method of ``async_methods(async class)`` it does not write itself. A result annotated as one
    of the async classes (or a list of them) comes back as its twin; ``also`` names more such
    wrappers by annotation (``{"Terminal": Blocking}``)."""
    wrappers: dict[str, type] = {aio.__name__: twin for aio, twin in twins.items()}
    wrappers.update(also or {})
    for aio, twin in twins.items():
        for name, method in async_methods(aio).items():
            if name in vars(twin):  # written by the twin itself (closing, say)
                continue
            if _iterates(method):
                made = blocking_iter(method)
            else:
                made = blocking(method, *_wrapper(inspect.signature(method).return_annotation, wrappers))
            made.__module__ = twin.__module__
            made.__qualname__ = f"{twin.__qualname__}.{name}"
            setattr(twin, name, made)


def _iterates(method: Callable[..., Any]) -> bool:
    returns = inspect.signature(method).return_annotation
    return inspect.isasyncgenfunction(method) or (isinstance(returns, str) and returns.startswith("AsyncIterator["))


def _wrapper(returns: Any, wrappers: Mapping[str, type]) -> tuple[Callable[[_Portal, Any], Any] | None, Any]:
    """(what turns a result annotated ``returns`` into its blocking twin, the twin's annotation),
    or (None, None) for a result passed as it is. Annotations are text (postponed evaluation)."""
    if not isinstance(returns, str):
        return None, None
    if returns in wrappers:
        twin = wrappers[returns]
        return twin, twin.__name__
    listed = re.fullmatch(r"list\[(\w+)\]", returns)
    if listed and listed[1] in wrappers:
        each = wrappers[listed[1]]
        return (lambda portal, items: [each(portal, item) for item in items]), f"list[{each.__name__}]"
    return None, None


def _like(call: Callable[..., Any], method: Callable[..., Any], returns: Any) -> Any:
    """``call`` named, documented and signed as ``method``, returning ``returns``."""
    functools.update_wrapper(call, method)
    call.__signature__ = inspect.signature(method).replace(  # type: ignore[attr-defined]  # functions take any attribute
        return_annotation=returns
    )
    call.__annotations__ = {**method.__annotations__, "return": returns}
    return call
