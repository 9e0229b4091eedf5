"""The documentation site builds without a broken link, and README.md's links lead somewhere.

``mkdocs build --strict`` (mkdocs.yml sets the validation) fails on a link to a page or an
anchor that does not exist and on a page left out of the navigation. README.md is not part of
the site (it is the repository's front door), so its relative links are checked here: each
names a file or directory of the repository, and a ``#fragment`` into a Markdown file names
one of its headings.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    # mkdocs comes with the test extra (hutch[docs]); without it this fails, it does not skip.
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    assert (tmp_path / "site" / "search" / "search_index.json").is_file(), "the site has no search index"


def _anchors(markdown: Path) -> set[str]:
    """The ids MkDocs' toc extension gives the page's headings (lowercase, punctuation dropped)."""
    out = set()
    for line in markdown.read_text().splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            text = re.sub(r"[`*_]", "", m[1]).strip().lower()
            out.add(re.sub(r"[\s]+", "-", re.sub(r"[^\w\s-]", "", text)))
    return out


def test_the_readme_links_lead_somewhere() -> None:
    broken = []
    text = (REPO / "README.md").read_text()
    for target in _LINK.findall(text):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = REPO / path if path else REPO / "README.md"
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target}: {path or 'README.md'} has no heading #{fragment}")
    assert not broken, "README.md links that lead nowhere:\n" + "\n".join(broken)
