"""The fenced code blocks of a Markdown page, with the markers that say how to run them.

The convention (written for readers at the end of docs/index.md) lives in
``tests/docs/test_code_blocks.py``'s docstring; this module only reads pages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

RUN_LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "js": "js", "javascript": "js"}
DATA_LANGS = {"text", "yaml", "json", "hcl"}
SERVICES = {"kafka", "postgres", "nomad", "cluster"}

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
_MARKER = re.compile(r"^\s*<!--\s*(?P<key>not run|needs|page needs|serve)\s*:\s*(?P<value>.*?)\s*-->\s*$")
_NO_SERVER = re.compile(r"^\s*<!--\s*without a server\s*-->\s*$")
_EXITS = re.compile(r"^(?P<cmd>.*?\S)\s+#\s*exits (?P<code>\d+)\b.*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    lang: str  # as written after the fence
    text: str
    not_run: str | None = None  # the reason, when marked
    needs: set[str] = field(default_factory=set)
    without_server: bool = False  # run as on a machine where no `hutch serve` runs

    @property
    def kind(self) -> str:
        """sh, python, js (run), data (never run) or unknown (refused)."""
        if self.lang in DATA_LANGS:
            return "data"
        return RUN_LANGS.get(self.lang, "unknown")

    def where(self, offset: int = 0) -> str:
        return f"{self.path.name}:{self.line + offset}"


@dataclass
class Page:
    path: Path
    blocks: list[Block]
    needs: set[str]  # the page's server and every block
    serve_args: list[str]
    problems: list[str]  # markers that mean nothing, reasons left out, unknown languages

    @property
    def runnable(self) -> list[Block]:
        return [b for b in self.blocks if b.kind in ("sh", "python", "js") and b.not_run is None]


def read_page(path: Path) -> Page:
    lines = path.read_text().split("\n")
    blocks: list[Block] = []
    page_needs: set[str] = set()
    serve_args: list[str] = []
    problems: list[str] = []
    pending: list[tuple[int, str, str]] = []  # markers on the lines just above a fence
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.match(line)
        fence = _FENCE.match(line)
        if _NO_SERVER.match(line):
            pending.append((i + 1, "without a server", ""))
            i += 1
            continue
        if marker:
            key, value = marker["key"], marker["value"]
            if key == "page needs":
                page_needs |= _services(value, path, i + 1, problems)
            elif key == "serve":
                serve_args += value.split()
            else:
                pending.append((i + 1, key, value))
            i += 1
            continue
        if fence:
            indent, lang = fence["indent"], fence["lang"]
            body: list[str] = []
            j = i + 1
            while j < len(lines) and lines[j].strip() != "```":
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j])
                j += 1
            block = Block(path, i + 2, lang, "\n".join(body) + "\n")
            for at, key, value in pending:
                if key == "not run":
                    if len(value) < 20:
                        problems.append(f"{path.name}:{at}: `not run` needs a reason saying what covers it instead")
                    block.not_run = value
                elif key == "without a server":
                    block.without_server = True
                else:
                    block.needs |= _services(value, path, at, problems)
            if block.kind == "unknown":
                problems.append(f"{path.name}:{i + 1}: a ```{lang} block: the doc test runs sh, python and js, "
                                f"and leaves {', '.join(sorted(DATA_LANGS))} alone; say which it is")
            blocks.append(block)
            pending = []
            i = j + 1
            continue
        if pending and line.strip():
            problems.append(f"{path.name}:{pending[0][0]}: a marker must be on the lines just above a ``` fence")
            pending = []
        i += 1
    return Page(path, blocks, page_needs, serve_args, problems)


def _services(value: str, path: Path, at: int, problems: list[str]) -> set[str]:
    names = set(value.split())
    if not names or names - SERVICES:
        problems.append(f"{path.name}:{at}: needs {value!r}: services are {', '.join(sorted(SERVICES))}")
    return names & SERVICES


def shell_script(block: Block) -> str:
    """The block as bash lines, one for one (line n of the block is line n of the result): a
    line ending in `# exits N` must exit N; every other command must succeed (set -e)."""
    out = []
    for n, line in enumerate(block.text.rstrip("\n").split("\n")):
        m = _EXITS.match(line)
        if m and not line.lstrip().startswith("#"):
            code = m["code"]
            out.append(
                f"{{ {m['cmd']}; }} && __doc_rc=0 || __doc_rc=$?; if [ \"$__doc_rc\" != {code} ]; then "
                f"echo \"doc-test: {block.where(n)}: expected exit {code}, got $__doc_rc\" >&2; exit 1; fi"
            )
        else:
            out.append(line)
    return "\n".join(out) + "\n"
