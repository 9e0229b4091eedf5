"""How the blocking facade (``hutch/sync.py``) is derived from the async client instead of
written twice: a :class:`_Portal` (an event loop on its own thread) and :func:`blocking` /
:func:`blocking_iter`, which turn an async method into a blocking one with the same name,
parameters and docstring.

A twin derives from :class:`Facade`, holds ``_portal`` and ``aio`` (the async object it
fronts) and lists its methods as ``get = blocking(SandboxClient.get)``; results that are themselves async objects
are wrapped (``blocking(SandboxClient.create, SyncSandbox)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

__all__ = ["Blocking", "Facade", "blocking", "blocking_iter", "iterate"]

P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W")
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
    ``aio``), and those methods named after the twin that holds them."""

    _portal: _Portal
    aio: Any  # the async object this one fronts

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in vars(cls).items():
            if getattr(value, "__blocking__", False):
                value.__module__ = cls.__module__
                value.__qualname__ = f"{cls.__qualname__}.{name}"


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


@overload
def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Facade, P], R]: ...


@overload
def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    wrap: Callable[[_Portal, R], W],
) -> Callable[Concatenate[Facade, P], W]: ...


def blocking(
    method: Callable[Concatenate[Any, P], Coroutine[Any, Any, R]],
    wrap: Callable[[_Portal, R], W] | None = None,
) -> Callable[Concatenate[Facade, P], R | W]:
    """``method`` of the async class, run on the facade's loop and waited for; its result
    passed through ``wrap(portal, result)`` when given (an async handle's blocking twin)."""

    def call(self: Facade, /, *args: P.args, **kwargs: P.kwargs) -> R | W:
        result = self._portal.call(method(self.aio, *args, **kwargs))
        return result if wrap is None else wrap(self._portal, result)

    returns = inspect.signature(method).return_annotation if wrap is None else _returns(wrap)
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


def _returns(wrap: Callable[..., Any]) -> Any:
    """What ``wrap`` makes, as an annotation: the class itself, or a function's return annotation."""
    return wrap.__name__ if isinstance(wrap, type) else inspect.signature(wrap).return_annotation


def _like(call: Callable[..., Any], method: Callable[..., Any], returns: Any) -> Any:
    """``call`` named, documented and signed as ``method``, returning ``returns``."""
    functools.update_wrapper(call, method)
    call.__signature__ = inspect.signature(method).replace(  # type: ignore[attr-defined]  # functions take any attribute
        return_annotation=returns
    )
    call.__annotations__ = {**method.__annotations__, "return": returns}
    call.__blocking__ = True  # type: ignore[attr-defined]  # a marker for Facade.__init_subclass__
    return call
