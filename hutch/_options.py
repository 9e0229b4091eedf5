"""What a new sandbox is made of: :class:`SandboxOptions`, the keyword options that
``SandboxClient.create`` and ``SandboxClient.run`` (and their blocking twins, and the CLI)
accept, written once, and how they become the wire's create body.

The options arrive as ``**options: Unpack[SandboxOptions]``: type checkers see every keyword;
:func:`with_sandbox_options` gives ``help()`` and ``inspect.signature`` the same explicit
keywords the methods had when they were spelled out, and :func:`check_options` keeps the
``TypeError`` an unknown keyword always raised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, TypeVar

from hutch._shapes import Duration, Files, _network, _resources, _timeouts, _wire_files
from hutch.errors import InvalidInput
from hutch.models import Network, Resources, Timeouts

__all__ = ["SandboxOptions", "check_options", "create_body", "with_sandbox_options"]

F = TypeVar("F", bound=Callable[..., Any])


class SandboxOptions(TypedDict, total=False):
    """The keyword options of a new sandbox; every one defaults to None (the server's choice)."""

    runtime: str | None
    runtime_id: str | None
    name: str | None
    description: str | None
    resources: Resources | Mapping[str, Any] | None
    env: Mapping[str, str] | None
    network: bool | Network | Mapping[str, Any] | None
    timeout: Duration | Timeouts | Mapping[str, Any] | None
    files: Files | None
    snapshot: str | None
    dependencies: Sequence[str] | None
    packages: Sequence[str] | None
    metadata: Mapping[str, Any] | None
    scopes: Sequence[str] | None
    project_id: str | None


#: The option names in declaration order (the order ``create`` always listed them in).
OPTION_NAMES: tuple[str, ...] = tuple(SandboxOptions.__annotations__)


def check_options(function: str, options: Mapping[str, Any]) -> None:
    """Raise the ``TypeError`` Python raises for an unknown keyword, as when the options
    were spelled out in the signature."""
    for key in options:
        if key not in SandboxOptions.__annotations__:
            raise TypeError(f"{function}() got an unexpected keyword argument {key!r}")


def with_sandbox_options(func: F) -> F:
    """Show ``func``'s ``**options`` as the explicit keyword-only parameters of
    :class:`SandboxOptions` (default None) in its ``__signature__``."""
    sig = inspect.signature(func)
    annotations = SandboxOptions.__annotations__
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                          annotation=_annotation_text(annotations[name]))
        for name in OPTION_NAMES
    ]
    kinds = [p.kind for p in sig.parameters.values()]
    # The options come first among the keyword-only parameters, as they were written.
    first_keyword = next((i for i, kind in enumerate(kinds) if kind >= inspect.Parameter.KEYWORD_ONLY),
                         len(kinds))
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params[first_keyword:first_keyword] = options
    func.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]  # functions take any attribute
    return func


def _annotation_text(annotation: Any) -> Any:
    """The annotation as written (a ``ForwardRef``'s text), like the methods' own."""
    return getattr(annotation, "__forward_arg__", annotation)


def create_body(options: SandboxOptions) -> dict[str, Any]:
    """The wire's create body for ``options`` (absent and None options are left out)."""
    runtime, runtime_id = options.get("runtime"), options.get("runtime_id")
    snapshot = options.get("snapshot")
    if snapshot and (runtime or runtime_id):
        raise InvalidInput(
            "snapshot: cannot specify both snapshot and runtime; snapshot includes its own runtime",
            field="snapshot",
        )
    env, metadata = options.get("env"), options.get("metadata")
    dependencies, packages = options.get("dependencies"), options.get("packages")
    scopes = options.get("scopes")
    body: dict[str, Any] = {
        "projectId": options.get("project_id"),
        "runtime": runtime,
        "runtimeId": runtime_id,
        "name": options.get("name"),
        "description": options.get("description"),
        "resources": _resources(options.get("resources")),
        "env": dict(env) if env is not None else None,
        "network": _network(options.get("network")),
        "timeout": _timeouts(options.get("timeout")),
        "files": _wire_files(options.get("files")),
        "snapshot": snapshot,
        "dependencies": list(dependencies) if dependencies else None,
        "packages": list(packages) if packages else None,
        "metadata": dict(metadata) if metadata is not None else None,
        "scopes": list(scopes) if scopes else None,
    }
    return {k: v for k, v in body.items() if v is not None}
