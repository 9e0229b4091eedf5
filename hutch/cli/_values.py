"""Value parsers for the CLI's flags (argparse ``type=``): each names what it expected."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hutch.core.errors import HutchError
from hutch.core.quantities import parse_bytes, parse_duration, parse_millicores
from hutch.models import FileToWrite


def _checked(parse: Callable[[str, str], Any], what: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        try:
            parse(what, text)
        except HutchError as err:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected {what}") from err
        return text

    check.__name__ = what  # argparse names the type in some messages
    return check


memory_value = _checked(parse_bytes, "a size such as 512Mi or 1Gi")
cpu_value = _checked(parse_millicores, "cpu such as 500m, 0.5 or 2")
duration_value = _checked(parse_duration, "a duration such as 30s, 5m or 1h")


def env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or "\0" in text:
        raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected KEY=VALUE")
    return key, value


def file_pair(text: str) -> FileToWrite:
    sandbox_path, sep, local_path = text.partition(":")
    if not sep or not sandbox_path or not local_path:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}; expected SANDBOX_PATH:LOCAL_PATH"
        )
    try:
        content = Path(local_path).expanduser().read_bytes()
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot read {local_path!r}: {err.strerror or err}"
        ) from err
    return FileToWrite(sandbox_path, content)


def _int_in(low: int, high: int | None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise argparse.ArgumentTypeError(f"invalid value {text!r}; expected an integer {bound}")
        return value

    parse.__name__ = "integer"
    return parse


def metadata_value(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid JSON: {err}") from err
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value
