"""Create-time installs: apt ``dependencies`` and npm/bun ``packages``, checked before
anything is made. The rules are the seeds' (the snapshot build schema's) and a little
stricter where an argument could be read as an option: nothing may start with ``-``."""

from __future__ import annotations

import re

from hutch.core.errors import InvalidInput

APT_RE = re.compile(r"[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?(?:=[A-Za-z0-9.+~:_-]+)?")
# Registry specs only: ``name``, ``@scope/name``, each with an optional ``@version|range|tag``.
# Stricter than the upstream pattern on purpose: ``file:``, ``git+ssh:``, URLs and paths
# would have the host's npm read host files or use the host's credentials.
NPM_RE = re.compile(r"(?:@[A-Za-z0-9_~][A-Za-z0-9._~-]*/)?[A-Za-z0-9_~][A-Za-z0-9._~-]*(?:@[A-Za-z0-9.^~<>=*+_-]+)?")
MAX_ITEMS = 50


def _check(value: object, field: str, rule: re.Pattern[str], what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise InvalidInput(f"{field}: expected a list of {what}", field=field)
    if len(value) > MAX_ITEMS:
        raise InvalidInput(f"{field}: at most {MAX_ITEMS} entries, got {len(value)}", field=field)
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or len(item) > 214 or not rule.fullmatch(item):
            raise InvalidInput(f"{field}: {item!r} is not {what[:-1] if what.endswith('s') else what}", field=field)
        if item not in out:
            out.append(item)
    return tuple(out)


def check_dependencies(value: object, field: str = "dependencies") -> tuple[str, ...]:
    """apt packages: ``name`` or ``name=version`` (``name:arch`` too)."""
    return _check(value, field, APT_RE, "apt packages such as curl or jq=1.7.1-3")


def check_packages(value: object, field: str = "packages") -> tuple[str, ...]:
    """npm packages from the registry: ``name``, ``name@version``, ``@scope/name@tag``."""
    return _check(value, field, NPM_RE, "npm packages such as typescript or zod@3")
