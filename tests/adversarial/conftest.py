"""Fixtures the attacker's tests share with the API tests (a server per test, on both profiles)."""

from tests.api.conftest import api, make_api, profile  # noqa: F401  # fixtures, found by pytest by name
