"""``hutch runtime build NAME...|--all``: build runtimes on this host, with a progress display.

Builds run here, not on a server: the runtime cache is this host's (``--cache``, else
HUTCH_RUNTIME_CACHE, else /var/cache/hutch/runtimes). The builder lives in
``drivers.local.rootfs`` and is imported only when this command runs, so the SDK and the
rest of the CLI do not depend on it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from typing import TextIO


class Progress:
    """Stage lines stay on screen; the builder's own output scrolls through one status line
    on a terminal (or is printed in full with ``--verbose``, or dropped when piped)."""

    def __init__(self, stream: TextIO, *, verbose: bool) -> None:
        self.stream = stream
        self.verbose = verbose
        self.live = stream.isatty() and not verbose
        self.started = time.monotonic()
        self._status = False

    def __call__(self, message: str) -> None:
        detail = message.startswith("  ")
        if detail and self.verbose:
            self._print(message)
        elif detail and self.live:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            line = f"  {time.monotonic() - self.started:5.0f}s {message.strip()}"
            self.stream.write("\r\x1b[K" + line[:width])
            self.stream.flush()
            self._status = True
        elif not detail:
            self._print(message)

    def _print(self, line: str) -> None:
        if self._status:
            self.stream.write("\r\x1b[K")
            self._status = False
        self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self._status:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._status = False


def run(args: argparse.Namespace, out: TextIO) -> int:
    from hutch.core import runtimes
    from hutch.core.errors import HutchError, RuntimeNotFound
    from hutch.drivers.local import rootfs

    cache = args.cache or rootfs.default_cache()
    if args.all == bool(args.names):
        print("hutch: error: name runtimes to build or pass --all (not both); known: "
              + ", ".join(r.name for r in runtimes.CATALOG), file=sys.stderr)
        return 2
    try:
        recipes = list(runtimes.CATALOG) if args.all else [rootfs.lookup(n) for n in args.names]
    except RuntimeNotFound as err:
        print(f"hutch: error: {err.message}", file=sys.stderr)
        return 2
    progress = Progress(sys.stderr, verbose=args.verbose)
    rows = []
    try:
        for i, recipe in enumerate(recipes, 1):
            cached = rootfs.is_built(cache, recipe) and not args.force
            progress(f"[{i}/{len(recipes)}] {recipe.name} ({recipe.recipe_hash})")
            started = time.monotonic()
            path = rootfs.build(recipe, cache, log=progress, force=args.force)
            manifest = rootfs.read_manifest(cache, recipe) or {}
            rows.append((recipe.name, "cached" if cached else f"built in {time.monotonic() - started:.0f}s",
                         f"{manifest.get('bytes', 0) / 2**20:.0f} MiB", manifest.get("version_output", "-"), str(path)))
    except HutchError as err:
        progress.done()
        print(f"hutch: error: {err.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.done()
        return 130
    progress.done()
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)) + "  " + row[4], file=out)
    return 0
