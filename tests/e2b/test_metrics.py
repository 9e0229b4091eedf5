"""E2B's metrics where the driver cannot read them, and the CPU rate from two readings
(api/e2b/metrics.py). What the local and node drivers read is tests/e2b/test_sdk.py's and
tests/contracts/test_driver.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from hutch.api.e2b.metrics import CpuReadings
from tests.e2b.conftest import E2bServer, _serve
from tests.system.server import KEY


@pytest.fixture(scope="module")
def fake_e2b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2bServer]:
    """A server on the fake driver, which measures nothing (it plays no UsageReporting)."""
    for served in _serve(tmp_path_factory, driver="fake"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("E2B_API_URL", served.url)
            mp.setenv("E2B_SANDBOX_URL", served.url)
            mp.setenv("E2B_API_KEY", KEY)
            mp.delenv("E2B_DEBUG", raising=False)
            mp.delenv("E2B_DOMAIN", raising=False)
            yield served


def test_a_driver_that_cannot_measure_is_refused_naming_every_missing_field(fake_e2b: E2bServer) -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        with pytest.raises(SandboxException) as caught:
            sbx.get_metrics()
    finally:
        sbx.kill()
    message = str(caught.value)
    assert "driver fake does not report" in message
    for field in ("cpuUsedPct", "cpuCount", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"):
        assert field in message


T0 = 1767225600.0  # a sandbox's start, Unix seconds


def test_cpu_use_is_the_rate_since_the_last_reading_or_the_start() -> None:
    readings = CpuReadings()
    # First reading: 5 CPU seconds over the 10 s since it started, on 2 CPUs: 25 %.
    assert readings.percent("sbx_a", T0, 5.0, 2, T0 + 10) == 25.0
    # Then 1.5 CPU seconds more in 1 s on 2 CPUs: 75 %, not the average since the start.
    assert readings.percent("sbx_a", T0, 6.5, 2, T0 + 11) == 75.0
    # Idle since: 0 %.
    assert readings.percent("sbx_a", T0, 6.5, 2, T0 + 13) == 0.0


def test_the_readings_kept_are_bounded_the_oldest_forgotten() -> None:
    readings = CpuReadings(size=2)
    for name in ("sbx_a", "sbx_b", "sbx_c"):
        readings.percent(name, T0, 1.0, 1, T0 + 10)
    # sbx_a was forgotten: 4 CPU seconds over the 20 since its start; sbx_c's last reading is
    # kept: 3 more over 10 s.
    assert readings.percent("sbx_a", T0, 4.0, 1, T0 + 20) == 20.0
    assert readings.percent("sbx_c", T0, 4.0, 1, T0 + 20) == 30.0
