# The fixtures E2B's python-sdk tests use (e2b-dev/E2B packages/python-sdk/tests/conftest.py
# at the commit in README.md), trimmed to those the kept tests need: no template builds,
# volumes or their mocks. The SDK is pointed at hutch by the environment (E2B_API_URL,
# E2B_SANDBOX_URL, E2B_API_KEY) that tests/e2b/test_upstream.py sets.
import asyncio
import os
import random
import string

import pytest
import pytest_asyncio

from e2b import AsyncCommandHandle, AsyncSandbox, CommandExitException, CommandHandle, Sandbox


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item._test_failed = rep.failed


@pytest.fixture
def test_api_key() -> str:
    return "e2b_" + "0" * 40


@pytest.fixture()
def sandbox_test_id():
    return "test_" + "".join(random.choices(string.ascii_lowercase + string.digits, k=8))


@pytest.fixture()
def template():
    return "base"


@pytest.fixture()
def sandbox_factory(request, template, sandbox_test_id):
    def factory(*, template_name: str = template, **kwargs):
        metadata = kwargs.setdefault("metadata", dict())
        metadata.setdefault("sandbox_test_id", sandbox_test_id)
        sandbox = Sandbox.create(template_name, **kwargs)
        request.addfinalizer(sandbox.kill)
        return sandbox

    return factory


@pytest.fixture()
def sandbox(sandbox_factory):
    return sandbox_factory()


@pytest_asyncio.fixture
async def async_sandbox_factory(request, template, sandbox_test_id):
    sandboxes: list = []

    async def factory(*, template_name: str = template, **kwargs):
        metadata = kwargs.setdefault("metadata", dict())
        metadata.setdefault("sandbox_test_id", sandbox_test_id)
        sandbox = await AsyncSandbox.create(template_name, **kwargs)
        sandboxes.append(sandbox)
        return sandbox

    yield factory
    await asyncio.gather(*(s.kill() for s in sandboxes), return_exceptions=True)


@pytest_asyncio.fixture
async def async_sandbox(async_sandbox_factory):
    return await async_sandbox_factory()


@pytest.fixture
def debug():
    return os.getenv("E2B_DEBUG") is not None


@pytest.fixture(autouse=True)
def skip_by_debug(request, debug):
    if request.node.get_closest_marker("skip_debug") and debug:
        pytest.skip("skipped because E2B_DEBUG is set")


class Helpers:
    @staticmethod
    def catch_cmd_exit_error_in_background(cmd: AsyncCommandHandle):
        disabled = False

        async def wait_for_exit():
            try:
                await cmd.wait()
            except CommandExitException as e:
                if not disabled:
                    assert False, f"command failed with exit code {e.exit_code}: {e.stderr}"

        asyncio.create_task(wait_for_exit())

        def disable():
            nonlocal disabled
            disabled = True

        return disable

    @staticmethod
    def check_cmd_exit_error(cmd: CommandHandle):
        try:
            cmd.wait()
        except CommandExitException as e:
            assert False, f"command failed with exit code {e.exit_code}: {e.stderr}"


@pytest.fixture
def helpers():
    return Helpers
