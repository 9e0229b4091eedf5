"""Shared test configuration.

Backends are chosen per contract suite by fixture parameters; the production backends
(Kafka, PostgreSQL, Nomad) join those parameter lists in their own issues. A backend
whose service is missing fails its setup loudly: nothing here skips.

The API tests (tests/api/conftest.py: ``driver_name`` x ``profile``) run on every driver and
both profiles unless a test says where it runs: ``@pytest.mark.runs_on("fake-embedded", ...)``
(on a test, or a module's ``pytestmark``), with the reason beside it. The usual places:
``WIRE``, ``STORE`` and ``REAL`` in tests/api/conftest.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

RUNTIME_CACHE = Path(os.environ.get("HUTCH_RUNTIME_CACHE", "/var/cache/hutch/runtimes"))
DRIVERS = ("fake", "local", "nomad", "node")
PROFILES = ("embedded", "production")


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``runs_on`` becomes one parametrization of (driver_name, profile), the pairs it names:
    placed as a ``parametrize`` mark, it takes precedence over the fixtures' own params."""
    mark = metafunc.definition.get_closest_marker("runs_on")
    if mark is None:
        return
    where = f"{metafunc.definition.nodeid}: runs_on{mark.args}"
    if not mark.args or not {"driver_name", "profile"} <= set(metafunc.fixturenames):
        raise pytest.UsageError(f"{where} names no pair, or the test uses no driver_name and profile")
    pairs = []
    for pair in mark.args:
        driver, _, profile = str(pair).partition("-")
        if driver not in DRIVERS or profile not in PROFILES:
            raise pytest.UsageError(f"{where}: {pair!r} is not <{'|'.join(DRIVERS)}>-<{'|'.join(PROFILES)}>")
        pairs.append((driver, profile))
    metafunc.definition.add_marker(pytest.mark.parametrize(("driver_name", "profile"), pairs, indirect=["profile"]))


# ---------------------------------------------------------------- the quick tier

# `./scripts/test --quick` (pytest --quick): the edit-test loop's tier, a few minutes on two
# cores and no service started: the unit tests, the API on the fake driver and the embedded
# profile, the SDK and the CLI against the in-test fake and the fake-driven engine, and the
# contract suites on their in-process backends. What needs a real service or driver stays in the
# full run: a test parametrized onto one (a param below) and the modules in NOT_QUICK.
QUICK = ("tests/unit/", "tests/api/", "tests/sdk/", "tests/cli/", "tests/contracts/")
SERVICE_PARAMS = {"local", "nomad", "node", "production", "kafka", "postgres", "docker"}
NOT_QUICK = (  # module paths or test ids (a prefix of the id), each for its reason
    "tests/api/test_openapi_fuzz.py",  # a live server fuzzed for minutes
    "tests/api/test_first_use_real.py",  # real runtime builds
    "tests/api/test_tenancy_upgrade.py::test_a_revocation_through_one_api_process_is_refused_by_another",  # PostgreSQL
    "tests/contracts/test_eventlog_kafka.py",  # Kafka
    "tests/contracts/test_eventlog_kafka_follow.py",  # Kafka
    "tests/contracts/test_projection_store_postgres.py",  # PostgreSQL
    "tests/contracts/test_projection_mirror_postgres.py",  # PostgreSQL
    "tests/contracts/test_output.py::test_another_replica_follows_a_live_stream",  # PostgreSQL, as the five below
    "tests/contracts/test_output.py::test_replicas_share_the_secret",
    "tests/contracts/test_output.py::test_a_stream_open_on_one_replica_cannot_be_opened_on_another",
    "tests/contracts/test_output.py::test_a_killed_writer_reads_as_closed_with_every_saved_byte",
    "tests/contracts/test_output.py::test_a_writer_whose_session_was_lost_opens_and_saves_on_a_new_one",
    "tests/contracts/test_output.py::test_a_close_answers_once_its_bytes_are_committed_and_the_release_follows",
    "tests/contracts/test_replicas.py::test_a_lapsed_lease",  # PostgreSQL, as those below
    "tests/contracts/test_replicas.py::test_a_replica_",
    "tests/contracts/test_replicas.py::test_a_take_over_says",
    "tests/contracts/test_replicas.py::test_a_claimed_replica",
    "tests/contracts/test_replicas.py::test_another_replica",
    "tests/contracts/test_replicas.py::test_live_replicas",
    "tests/contracts/test_replicas.py::test_serialised_holds",
    "tests/contracts/test_replicas.py::test_owners_recorded_together",
    "tests/cli/test_ssh_tmux.py",  # the local driver
    "tests/sdk/test_workspace",  # the local driver and Docker (unix-local alone is a fraction)
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="only the quick tier: no service, no real driver (tests/conftest.py)")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With --quick, what is outside the tier is not even imported (collecting everything takes
    as long as some of the tier's tests)."""
    if not config.getoption("quick"):
        return None
    if not collection_path.is_relative_to(config.rootpath / "tests"):
        return None
    rel = collection_path.relative_to(config.rootpath).as_posix()
    if collection_path.is_dir():
        inside = rel == "tests" or any(q.startswith(rel + "/") or (rel + "/").startswith(q) for q in QUICK)
        return None if inside else True
    return True if not rel.startswith(QUICK) or any(rel.startswith(n) for n in NOT_QUICK if "::" not in n) else None


def _needs_a_service(item: pytest.Item) -> bool:
    if not item.nodeid.startswith(QUICK) or item.nodeid.startswith(NOT_QUICK):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(isinstance(v, str) and v in SERVICE_PARAMS for v in params.values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("quick"):
        items.sort(key=_rank)  # stable: a module's tests keep their order
        return
    slow = [item for item in items if _needs_a_service(item)]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not _needs_a_service(item)]


# ---------------------------------------------------------------- what a rerun failed on

# scripts/test runs a failed test once more (--reruns 1); pytest-rerunfailures' summary then names
# a test that passed on its second try but keeps nothing of why the first failed. Kept here (on
# xdist's controller too, which sees every worker's reports) and printed at the end.
_RERUN_ERRORS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun" and report.longrepr is not None:  # pytest-rerunfailures' own outcome
        _RERUN_ERRORS.append((f"{report.nodeid} ({report.when})", str(report.longrepr)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _RERUN_ERRORS:
        terminalreporter.section("why the reruns failed the first time")
        for where, text in _RERUN_ERRORS:
            lines = text.splitlines()
            terminalreporter.write_line(f"{where}: ...{len(lines) - 40} lines above" if len(lines) > 40 else f"{where}:")
            for line in lines[-40:]:
                terminalreporter.write_line(line)


# ---------------------------------------------------------------- two workers

# scripts/test runs the suite on two pytest-xdist workers (``-n 2``): much of a test's time is
# waiting (Nomad placements, leases, node-loss timeouts, service restarts), and one process at a
# time left a third of the two cores idle. xdist hands out whole scopes: here a scope is a test
# module (its module fixtures made once), except that every user of the 3-client cluster is one
# scope, run in order on one worker: tests/cluster stops and restarts the cluster and cuts its
# links, which no other test may meet. Each module makes its own servers, databases, topics and
# sandboxes, so two modules at once share only what a production host shares between servers
# (the Nomad dev agent, the Kafka broker, the PostgreSQL server). Without xdist (``-n 0``) only
# the order below applies.
CLUSTER_USERS = (
    "tests/cluster/", "tests/infra/",  # the cluster, and Terraform onto it
    "tests/adversarial/test_node_namespace.py", "tests/adversarial/test_nomad_attacker.py",
    "tests/adversarial/test_pass2_nomad_api.py", "tests/adversarial/test_pass2_nomad_network.py",
)
# The longest scopes go first, so that neither worker is left with a long one at the end (the
# cluster's, ~8 minutes, before all; then modules of a minute or more).
LONG_FIRST = (
    "tests/docs/test_code_blocks.py", "tests/compat/test_agentuity_client.py",
    "tests/compat/test_agentuity_cli.py", "tests/nomad/test_nomad_isolation.py",
    "tests/system/test_production.py", "tests/e2b/test_upstream.py", "tests/api/test_openapi_fuzz.py",
    "tests/contracts/test_driver.py", "tests/nomad/test_exec_agent.py", "tests/adversarial/test_tenancy.py",
    "tests/packaging/test_wheel.py", "tests/system/test_log_identity.py",
)


def scope(nodeid: str) -> str:
    return "cluster" if nodeid.startswith(CLUSTER_USERS) else nodeid.split("::")[0]


def _rank(item: pytest.Item) -> int:
    where = scope(item.nodeid)
    if where == "cluster":
        return 0
    return 1 + LONG_FIRST.index(where) if where in LONG_FIRST else len(LONG_FIRST) + 1


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduler of whole scopes, with ``scope`` above as the scope, handed out in the
    collection's order (which ``_rank`` made longest first)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    config.option.loadscopereorder = False  # xdist's own order is by test count, not time
    return Scopes(config, log)
