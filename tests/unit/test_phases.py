"""core/phases.py: spans are kept only with HUTCH_PHASES=1, and then under their names."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hutch.core import phases


@pytest.fixture
def nothing_kept() -> Iterator[None]:
    phases.clear()
    yield
    phases.clear()


@pytest.mark.usefixtures("nothing_kept")
def test_off_a_span_keeps_nothing_and_reads_no_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "ON", False)
    with phases.span("append"):
        pass
    t0 = phases.start()
    phases.end("decide", t0)
    assert t0 == 0
    assert phases.taken() == {}


@pytest.mark.usefixtures("nothing_kept")
def test_on_each_span_is_kept_under_its_name_in_milliseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "ON", True)
    for _ in range(2):
        with phases.span("append"):
            pass
    with pytest.raises(ValueError, match="refused"), phases.span("decide"):  # timed on failure too
        raise ValueError("refused")
    phases.end("auth", phases.start())
    kept = phases.taken()
    assert sorted(kept) == ["append", "auth", "decide"]
    assert len(kept["append"]) == 2 and len(kept["decide"]) == 1
    assert all(0 <= ms < 1000 for ms in kept["append"] + kept["decide"] + kept["auth"])


@pytest.mark.usefixtures("nothing_kept")
def test_on_at_most_keep_durations_are_kept_per_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(phases, "ON", True)
    monkeypatch.setattr(phases, "KEEP", 3)
    for _ in range(5):
        phases.end("append", phases.start())
    assert len(phases.taken()["append"]) == 3
