"""Every code block of README.md and docs/*.md runs as written.

The convention (docs/index.md, "How the code on these pages is tested", says the same to readers):

- A page's ```sh blocks are one shell session run in order (bash, ``set -e -o pipefail``): a
  variable one block sets is there in the next. They run in a fresh directory holding links
  to the repository's top-level folders (``./scripts/…`` and ``examples/…`` work as from a
  checkout), with a fresh HOME, against one ``hutch serve`` started for the page (local
  driver, data dir in that HOME), ``HUTCH_URL`` and ``HUTCH_API_KEY`` exported. At the end
  every sandbox left is destroyed and the server stopped.
- A line whose comment says ``# exits N`` must exit N; any other failing command fails.
- ```python blocks are whole programs: each is saved to a file and run with python3 as it is
  (no top-level ``await``: a reader who saves one and runs it gets what the test got);
  ```js blocks run with node as ES modules, the compatibility test's node_modules beside them.
- ```text, ```yaml, ```json, ```hcl blocks are output or data, never run; any other
  language fails the page, so nothing escapes by accident.
- ``<!-- not run: REASON -->`` on the line(s) above a block: it cannot run as written (a
  server that never returns, an interactive terminal, a command that installs or stops the
  machine's shared services); the reason says what covers it instead.
  ``<!-- needs: kafka postgres -->`` (``nomad``, ``cluster``): the block gets those services'
  settings, and fails (never skips) when they are missing. ``<!-- without a server -->``: the
  block runs as where no ``hutch serve`` runs (no ``HUTCH_URL``, a data dir nobody serves): the
  engine in the CLI's own process; the sandboxes it leaves are destroyed at the end.
- Page-wide: ``<!-- page needs: … -->`` puts the page's server on those services
  (``kafka postgres``: a fresh topic and database; ``nomad``: the nomad driver),
  ``<!-- serve: ARGS -->`` adds arguments to its ``hutch serve``.

A failure names the page, the line and the command, with the block's output.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs.blocks import read_page
from tests.docs.session import REPO, page_session

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", PAGES, ids=[p.name for p in PAGES])
def test_every_block_of_the_page_runs_as_written(path: Path) -> None:
    page = read_page(path)
    assert not page.problems, "\n".join(page.problems)
    if not page.runnable:
        return
    with page_session(page) as session:
        session.start_server()
        for block in page.blocks:
            if block.kind in ("sh", "python", "js") and block.not_run is None:
                session.run(block)
                if session.failures:
                    break  # later blocks of a shell session build on this one
        failures = list(session.failures)
        print("\n".join(f"{where}: {seconds:.1f} s" for where, seconds in session.timings))
    assert not failures, "\n\n".join(failures)
    assert not session.cleanup_errors, "\n".join(session.cleanup_errors)


def test_the_convention_is_held_by_the_pages() -> None:
    """Markers mean what they say, and the pages mark few blocks as not run."""
    pages = [read_page(p) for p in PAGES]
    runs = sum(len(p.runnable) for p in pages)
    skipped = [(b.where(), b.not_run) for p in pages for b in p.blocks if b.not_run is not None]
    assert runs >= 25, f"only {runs} blocks run"
    assert len(skipped) <= 15, "too many blocks are not run:\n" + "\n".join(f"{w}: {r}" for w, r in skipped)
