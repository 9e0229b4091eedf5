"""`hutch org|project|key …` against a served hutch, and the SDK's ``client.tenancy`` (both
facades) with a key of another organization."""

from __future__ import annotations

import json
import os

import pytest

from hutch import SandboxClient, SyncSandboxClient
from hutch.errors import SandboxError
from tests.cli.test_cli_live_files_jobs import cli, url  # noqa: F401  (the served-hutch fixture)


def test_org_project_key_commands(url: str, capsys: pytest.CaptureFixture[str],  # noqa: F811
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = cli(capsys, "org", "create", "acme", "--json")
    assert code == 0, err
    assert json.loads(out)["id"] == "org_acme"
    code, out, _ = cli(capsys, "org", "list", "--json")
    assert {o["id"] for o in json.loads(out)} == {"org_local", "org_acme"}
    code, out, _ = cli(capsys, "project", "create", "web", "--org", "org_acme", "--json")
    project = json.loads(out)
    assert code == 0 and project["orgId"] == "org_acme" and project["id"].startswith("proj_")
    code, out, _ = cli(capsys, "project", "list", "--org", "org_acme")
    assert "web" in out
    code, out, err = cli(capsys, "key", "create", "--org", "acme", "--role", "admin", "--name", "ops")  # a name
    secret = out.strip()
    assert code == 0 and secret.startswith("hk_") and "shown only now" in err and "admin of org_acme" in err
    code, _, err = cli(capsys, "key", "list", "--org", "acne")
    assert code == 2 and "no organization of that name" in err and "ids look like org_acne" in err
    assert "org_acme (acme)" in err
    code, out, _ = cli(capsys, "key", "create", "--org", "org_acme", "--role", "read-only", "--project", "web",
                       "--expires", "7d", "--json")
    reader = json.loads(out)
    assert reader["role"] == "read-only" and reader["projects"] == [project["id"]] and reader["secret"]
    # The new admin key manages its own organization: no --org needed.
    bootstrap = os.environ["HUTCH_API_KEY"]
    monkeypatch.setenv("HUTCH_API_KEY", secret)
    code, out, _ = cli(capsys, "key", "list", "--json")
    listed = json.loads(out)
    assert {k["name"] for k in listed} == {"ops", reader["id"]} and "secret" not in out
    code, out, _ = cli(capsys, "key", "list")
    assert "ops" in out and "active" in out
    code, _, err = cli(capsys, "org", "quota", "org_acme", "--sandboxes", "99")  # quotas are the operator's
    assert code == 1 and "administrator" in err
    monkeypatch.setenv("HUTCH_API_KEY", bootstrap)
    code, out, _ = cli(capsys, "org", "quota", "org_acme", "--sandboxes", "2", "--memory", "4Gi", "--json")
    assert code == 0 and json.loads(out)["quota"] == {"sandboxes": 2, "memoryBytes": 4 * 2**30}
    monkeypatch.setenv("HUTCH_API_KEY", secret)
    code, out, _ = cli(capsys, "org", "get", "org_acme")
    assert "sandboxes=2" in out
    code, out, _ = cli(capsys, "key", "revoke", reader["id"])
    assert code == 0 and f"revoked {reader['id']}" in out
    code, _, err = cli(capsys, "org", "create", "other")  # not the server's administrator
    assert code == 1 and "administrator" in err
    code, _, err = cli(capsys, "--org-id", "org_local", "sandbox", "list")
    assert code == 1 and "orgId" in err


def test_sdk_tenancy_and_org_id(url: str) -> None:  # noqa: F811
    import asyncio

    async def main() -> None:
        async with SandboxClient() as admin:
            await admin.tenancy.create_org("beta")
            beta = SandboxClient(org_id="org_beta")
            key = await beta.tenancy.create_key("member", name="agent")
            assert key.secret and key.org_id == "org_beta"
            made = await beta.create()
            await beta.close()
            async with SandboxClient(api_key=key.secret) as member:
                assert (await member.get(made.id)).sandbox_id == made.id
                assert [s.sandbox_id for s in (await member.list()).sandboxes] == [made.id]
                with pytest.raises(SandboxError) as refused:
                    await member.tenancy.create_key("admin")
                assert refused.value.status == 403
                await member.destroy(made.id)
            assert (await admin.list()).total == 0  # org_local sees none of beta's

    asyncio.run(main())
    with SyncSandboxClient(org_id="org_beta") as client:
        assert [k.name for k in client.tenancy.list_keys()] == ["agent"]
        assert client.tenancy.get_org("org_beta").usage is not None


def test_names_print_as_text_never_as_terminal_controls(url: str,  # noqa: F811
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A member named a sandbox ``\\x1b]52;c;…\\x07`` (writes the reader's clipboard), with a
    newline and a forged row, or with U+202E: ``hutch sandbox list``/``get`` printed it as it
    was, so whoever listed the organization's sandboxes ran it. Characters that are not shown
    as themselves are printed escaped (``\\x1b``, ``\\n``, ``\\u202e``); JSON output is JSON."""
    hostile = "a\x1b]52;c;ZXZpbA==\x07b\nsbx_forged  ready\u202exe"
    code, out, err = cli(capsys, "sb", "create", "--name", hostile)
    assert code == 0, err
    sid = out.strip()
    for argv in (("sandbox", "list"), ("sandbox", "get", sid)):
        code, out, err = cli(capsys, *argv)
        assert code == 0, err
        assert not any(c in out for c in "\x1b\x07\u202e"), out  # before: the escape as sent
        assert "a\\x1b]52;c;ZXZpbA==\\x07b\\nsbx_forged  ready\\u202exe" in out, out
    code, out, _ = cli(capsys, "sandbox", "get", sid, "--json")
    assert json.loads(out)["name"] == hostile
