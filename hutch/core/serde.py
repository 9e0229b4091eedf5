"""The one cattrs converter. Every attrs class is (un)structured with camelCase keys,
the shape the wire and the stored log both use, and ``None`` fields are left out."""

from __future__ import annotations

from enum import Enum
from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override


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
