"""The one cattrs converter. Every attrs class is (un)structured with camelCase keys,
the shape the wire and the stored log both use, and ``None`` fields are left out.

One converter for the log (``core.events``), the projection store's documents and the wire
(``core.wire``, read by the SDK through :func:`from_wire`): a class is camelCased because it is
an attrs class, not because of the module it lives in, so moving one changes no key.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from hutch.core.errors import ServerError

T = TypeVar("T")


def to_camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=False)

    def unstructure_factory(cl: type) -> Any:
        overrides = {a.name: override(rename=to_camel(a.name), omit_if_default=a.default is None) for a in attrs.fields(cl)}
        # mypy matches a ** of per-attribute overrides against cattrs' own keyword flags (bool).
        return make_dict_unstructure_fn(cl, conv, **overrides)  # type: ignore[arg-type]  # overrides, not cattrs' own flags

    def structure_factory(cl: type) -> Any:
        overrides = {a.name: override(rename=to_camel(a.name)) for a in attrs.fields(cl)}
        return make_dict_structure_fn(cl, conv, **overrides)  # type: ignore[arg-type]  # overrides, not cattrs' own flags

    conv.register_unstructure_hook_factory(attrs.has, unstructure_factory)
    conv.register_structure_hook_factory(attrs.has, structure_factory)
    # Tuples and frozensets round-trip through JSON lists.
    conv.register_unstructure_hook(frozenset, lambda s: sorted(s))
    conv.register_unstructure_hook_func(
        lambda t: isinstance(t, type) and issubclass(t, Enum), lambda v: v.value
    )
    return conv


converter = _make_converter()


def from_wire(cls: type[T], data: Any) -> T:
    """Parse one wire object (camelCase dict) into ``cls``.

    Raises :class:`~hutch.core.errors.ServerError` (code ``BAD_RESPONSE``) when the server's
    answer does not fit, naming what.
    """
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, KeyError, TypeError, ValueError) as err:
        detail = (
            "; ".join(cattrs.transform_error(err))
            if isinstance(err, cattrs.BaseValidationError)
            else str(err)
        )
        raise ServerError(
            f"unexpected response shape for {cls.__name__}: {detail}", code="BAD_RESPONSE"
        ) from err


def to_wire(obj: Any) -> Any:
    """A model (or list of models) as the wire's camelCase dicts, ``None`` fields left out."""
    return converter.unstructure(obj)
