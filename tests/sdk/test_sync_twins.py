"""The blocking facade is derived from the async client: every public async method has a
blocking twin with the same parameters and docstring, and the create options are written
once (``SandboxOptions``) yet still shown and checked as explicit keywords."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from hutch import Sandbox, SandboxClient, SyncSandbox, SyncSandboxClient
from hutch._options import OPTION_NAMES
from hutch.handles import ExecutionHandle, JobHandle
from hutch.sync import SyncExecutionHandle, SyncJobHandle

TWINS = [
    (SandboxClient, SyncSandboxClient),
    (Sandbox, SyncSandbox),
    (JobHandle, SyncJobHandle),
    (ExecutionHandle, SyncExecutionHandle),
]


def _async_methods(cls: type) -> dict[str, Callable[..., Any]]:
    """Public coroutine and async-generator methods, and plain ones returning an async iterator."""
    found: dict[str, Callable[..., Any]] = {}
    for name, member in inspect.getmembers(cls, inspect.isfunction):
        if name.startswith("_"):
            continue
        returns = str(inspect.signature(member).return_annotation)
        if (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member)
                or returns.startswith("AsyncIterator")):
            found[name] = member
    return found


def _parameters(func: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
    return [(p.name, p.kind, p.default, p.annotation)
            for p in inspect.signature(func).parameters.values()]


@pytest.mark.parametrize(("aio", "sync"), TWINS, ids=[s.__name__ for _, s in TWINS])
def test_every_async_method_has_a_blocking_twin(aio: type, sync: type) -> None:
    methods = _async_methods(aio)
    assert methods, aio
    missing = sorted(name for name in methods if not hasattr(sync, name))
    assert missing == [], f"{sync.__name__} lacks {missing}"
    for name, method in methods.items():
        twin = getattr(sync, name)
        assert _parameters(twin) == _parameters(method), name
        assert inspect.getdoc(twin) == inspect.getdoc(method), name
        assert not inspect.iscoroutinefunction(twin), name


def test_blocking_twins_are_named_after_their_class() -> None:
    assert SyncSandboxClient.get.__qualname__ == "SyncSandboxClient.get"
    assert SyncSandbox.fork.__annotations__["return"] == "list[SyncSandbox]"
    assert inspect.signature(SyncSandboxClient.create).return_annotation == "SyncSandbox"
    assert str(inspect.signature(SyncSandboxClient.read_file).return_annotation) == "Iterator[bytes]"


@pytest.mark.parametrize("method", [SandboxClient.create, SandboxClient.run, SyncSandboxClient.create])
def test_create_options_show_as_keywords(method: Callable[..., Any]) -> None:
    params = inspect.signature(method).parameters
    for name in OPTION_NAMES:
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default is None
    assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


async def test_unknown_create_option_is_a_type_error() -> None:
    async with SandboxClient("http://127.0.0.1:9", "k") as client:
        with pytest.raises(TypeError, match="unexpected keyword argument 'runtme'"):
            await client.create(runtme="python")  # type: ignore[call-arg]  # the typo is the point
        with pytest.raises(TypeError, match="run\\(\\) got an unexpected keyword argument"):
            await client.run(["true"], runtme="python")  # type: ignore[call-arg]  # the typo is the point
