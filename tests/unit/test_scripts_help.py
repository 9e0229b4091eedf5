"""The set-up scripts answer --help with what they do, and refuse what they do not take.

`./scripts/test --help` used to run the whole set-up and suite (20 minutes, and its pip step
re-pointed the machine's hutch install), and `./scripts/install --anything` installed as if
nothing had been given."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script(*argv: str) -> subprocess.CompletedProcess[str]:
    # A few seconds at most: anything longer is the script installing instead of answering.
    return subprocess.run([str(REPO / "scripts" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_test_script_prints_what_it_does_and_runs_nothing(flag: str) -> None:
    done = _script("test", flag)
    assert done.returncode == 0, done.stderr
    assert "Installs everything the tests need" in done.stdout
    assert "--quick" in done.stdout
    assert "==>" not in done.stderr  # no install step began


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_install_script_prints_what_it_does_and_installs_nothing(flag: str) -> None:
    done = _script("install", flag)
    assert done.returncode == 0, done.stderr
    assert "./scripts/install --dev" in done.stdout
    assert "==>" not in done.stderr


def test_the_install_script_refuses_an_argument_it_does_not_take_by_name() -> None:
    done = _script("install", "--devv")
    assert done.returncode == 2
    assert "unknown argument '--devv'" in done.stderr
    assert "--dev" in done.stderr
    assert "==>" not in done.stderr
