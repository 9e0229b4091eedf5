"""Fixtures the adversarial tests share with the API tests (an in-process server per test,
on every profile): imported, not copied."""

from tests.api.conftest import api, make_api, profile

__all__ = ["api", "make_api", "profile"]
