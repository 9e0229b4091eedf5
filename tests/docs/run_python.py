"""Runs a page's ```python block as a script in which top-level ``await`` and ``async with``
are allowed (as in ``python -m asyncio``), so examples read as they would inside a coroutine."""

import ast
import asyncio
import sys


def main(path: str) -> None:
    with open(path) as f:
        source = f.read()
    code = compile(source, path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, {"__name__": "__main__", "__file__": path})
    if asyncio.iscoroutine(result):
        asyncio.run(result)


if __name__ == "__main__":
    main(sys.argv[1])
