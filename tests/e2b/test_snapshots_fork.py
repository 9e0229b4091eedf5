"""Snapshots and fork on the E2B wire with the real ``e2b`` SDK: what E2B's own tests
(tests/e2b/upstream) do not check: one organization's snapshots and forks are invisible to
another's key, a fork's timeout is its own, and bad input is refused naming the field."""

from __future__ import annotations

from typing import Any

import pytest
from e2b import Sandbox
from e2b.exceptions import NotFoundException, SandboxException, SandboxNotFoundException

from tests.e2b.conftest import E2bServer


@pytest.fixture(scope="module")
def sandbox(e2b_env: E2bServer) -> Sandbox:
    return Sandbox.create(timeout=120)


def test_a_snapshot_seeds_sandboxes_and_is_its_organizations_only(e2b_env: E2bServer, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/snap/note.txt", "kept")
    snap = sandbox.create_snapshot(name="e2b-own")
    assert snap.snapshot_id.startswith("snp_") and snap.names == ["e2b-own:latest"]
    listed = Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id).next_items()
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]
    assert [s.snapshot_id for s in Sandbox.list_snapshots(name="e2b-own:latest").next_items()] == [snap.snapshot_id]
    assert Sandbox.list_snapshots(name="e2b-own:other").next_items() == []

    other = e2b_env.key_of_new_org("e2bsnapother")
    assert Sandbox.list_snapshots(api_key=other).next_items() == []
    assert Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id, api_key=other).next_items() == []
    with pytest.raises(SandboxException, match=f"404: templateID: snapshot '{snap.snapshot_id}' not found"):
        Sandbox.create(snap.snapshot_id, api_key=other, timeout=30)
    assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=other) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(sandbox.sandbox_id, api_key=other)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(sandbox.sandbox_id, api_key=other)

    with pytest.raises(SandboxException, match="404: template 'e2b-own' not found"):
        Sandbox.create("e2b-own", api_key=other, timeout=30)

    with Sandbox.create(snap.snapshot_id, timeout=60) as made:
        assert made.files.read("/home/user/snap/note.txt") == "kept"
    with Sandbox.create("e2b-own:latest", timeout=60) as by_name:  # E2B names a snapshot as a template
        assert by_name.files.read("/home/user/snap/note.txt") == "kept"
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False


def test_a_fork_has_the_files_the_forkers_organization_and_its_own_timeout(e2b_env: E2bServer,
                                                                           sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/forked.txt", "before")
    [fork] = sandbox.fork(timeout=45)
    assert isinstance(fork, Sandbox)
    try:
        assert fork.files.read("/home/user/forked.txt") == "before"
        assert fork.commands.run("id -un").stdout == "user\n"
        hutch = e2b_env.server.data("GET", f"/sandbox/sbx_{fork.sandbox_id}")
        assert hutch["timeout"]["idle"] == "45s"
        assert hutch["metadata"]["forkedFrom"] == "sbx_" + sandbox.sandbox_id  # hutch's API: its own form
        other = e2b_env.key_of_new_org("e2bforkother")
        with pytest.raises(NotFoundException):
            Sandbox.get_info(fork.sandbox_id, api_key=other)
    finally:
        fork.kill()


@pytest.mark.parametrize(("method", "path", "body", "status", "says"), [
    ("POST", "/sandboxes/{id}/snapshots", {"name": "a/b"}, 400, "name: 'a/b' may only hold"),
    ("POST", "/sandboxes/{id}/snapshots", {"name": 7}, 400, "name: "),
    ("POST", "/sandboxes/{id}/snapshots", {"memory": True}, 501, "memory: hutch's snapshots keep the files"),
    ("POST", "/sandboxes/{id}/snapshots", {"memory": "yes"}, 400, "memory: expected true or false"),
    ("POST", "/sandboxes/{id}/snapshots", {"tag": "x"}, 400, "tag: not a field of a snapshot request"),
    ("POST", "/sandboxes/{id}/fork", {"count": 0}, 400, "count: expected an integer from 1 to 20"),
    ("POST", "/sandboxes/{id}/fork", {"count": "2"}, 400, "count: expected an integer from 1 to 20"),
    ("POST", "/sandboxes/{id}/fork", {"timeout": -1}, 400, "timeout: expected whole seconds"),
    ("POST", "/sandboxes/{id}/fork", [1], 400, "body: expected a JSON object"),
    ("POST", "/sandboxes/sbx_nope/fork", {}, 404, "sandbox sbx_nope not found"),
    ("GET", "/snapshots?limit=0", None, 400, "limit: must be between 1 and 100, got '0'"),
    ("GET", "/snapshots?nextToken=x", None, 400, "nextToken: not a token this server gave"),
    ("DELETE", "/templates/base", None, 400, "base is one of hutch's runtimes"),
])
def test_bad_input_is_refused_in_e2bs_shape_naming_the_field(e2b_env: E2bServer, sandbox: Sandbox, method: str,
                                                             path: str, body: Any, status: int, says: str) -> None:
    code, answer = e2b_env.call(method, path.format(id=sandbox.sandbox_id), body)
    assert (code, answer["code"]) == (status, status), answer
    assert says in answer["message"], answer
    assert sandbox.is_running()
