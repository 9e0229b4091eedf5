"""The real ``e2b`` SDK (sync and async) against hutch's E2B wire: create, run a command and
read its output and exit code, list, kill, a missing sandbox, and one organization's key and
envd token opening nothing of another's."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)
from e2b.exceptions import (
    AuthenticationException,
    FileNotFoundException,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)

from hutch.api.e2b.watch_routes import MAX_PER_SANDBOX
from tests.e2b.conftest import E2bServer
from tests.system.server import KEY


@pytest.fixture(scope="module")
def sandbox(e2b_env: E2bServer) -> Sandbox:
    return Sandbox.create(timeout=120)


def test_a_command_runs_and_its_output_and_exit_code_come_back(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2; printf '%s' \"$GREETING\"", envs={"GREETING": "hello"})
    assert (result.stdout, result.stderr, result.exit_code) == ("out\nhello", "err\n", 0)
    in_tmp = sandbox.commands.run("pwd", cwd="/tmp")
    assert in_tmp.stdout == "/tmp\n"


def test_the_sandbox_runs_as_e2bs_user_in_its_home(sandbox: Sandbox) -> None:
    """As E2B's base template: the account ``user``, home /home/user, where commands start."""
    who = sandbox.commands.run('id -un; echo "$HOME"; pwd; stat -c %U .').stdout
    assert who == "user\n/home/user\n/home/user\nuser\n"
    assert sandbox.files.write("from-files.txt", "x").path == "/home/user/from-files.txt"
    assert sandbox.commands.run("stat -c %U from-files.txt; rm from-files.txt").stdout == "user\n"


def test_a_snapshot_of_its_home_seeds_the_home_of_a_sandbox_made_from_it(e2b_env: E2bServer,
                                                                        sandbox: Sandbox) -> None:
    """A hutch snapshot is the home's files: E2B's user finds them in /home/user."""
    sandbox.files.write("kept/note.txt", "from the snapshot")
    snap = e2b_env.server.data("POST", f"/sandbox/sbx_{sandbox.sandbox_id}/snapshot", {"name": "e2b-home"})
    sandbox.files.remove("kept")
    with Sandbox.create(snap["snapshotId"], timeout=60) as made:
        assert made.commands.run("id -un; cat /home/user/kept/note.txt").stdout == "user\nfrom the snapshot"


def test_a_failing_command_raises_with_its_exit_code(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as caught:
        sandbox.commands.run("echo partial; exit 3")
    assert caught.value.exit_code == 3 and caught.value.stdout == "partial\n"


def test_a_background_command_is_listed_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 60", background=True)
    assert handle.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert handle.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(handle.pid) is False  # gone: envd's not_found


def test_files_are_written_read_listed_and_removed(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/a.txt", "first")  # parents made; relative: the user's home
    assert info.path == "/home/user/notes/a.txt"
    sandbox.files.write("/tmp/b.bin", b"\x00\xff")
    assert sandbox.files.read("notes/a.txt") == "first"
    assert sandbox.files.read("/tmp/b.bin", format="bytes") == b"\x00\xff"
    assert sandbox.commands.run("cat notes/a.txt").stdout == "first"  # the same home as commands
    assert [e.name for e in sandbox.files.list("notes")] == ["a.txt"]
    assert sandbox.files.make_dir("notes") is False  # exists already
    sandbox.files.remove("notes")
    assert not sandbox.files.exists("notes/a.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("notes/a.txt")


def test_a_listing_larger_than_the_server_holds_is_refused_naming_the_bound(sandbox: Sandbox) -> None:
    sandbox.commands.run("mkdir -p big && cd big && touch $(seq 1 10001)")
    with pytest.raises(InvalidArgumentException, match="more than 10000 entries below '/home/user/big'"):
        sandbox.files.list("big")
    assert len(sandbox.files.list("/home/user", depth=1)) >= 1  # a narrower listing still answers
    sandbox.commands.run("rm -rf big")


def test_info_and_list_show_the_sandbox(sandbox: Sandbox) -> None:
    info = sandbox.get_info()
    assert (info.sandbox_id, info.template_id, info.state.value) == (sandbox.sandbox_id, "base", "running")
    assert info.allow_internet_access is False  # hutch's default, whatever E2B's is
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    assert sandbox.sandbox_id in listed


def test_info_names_the_owner_and_group_as_the_sandbox_does(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/owned.txt", "x")
    user = sandbox.commands.run("id -un").stdout.strip()
    info = sandbox.files.get_info("/tmp/owned.txt")
    assert (info.owner, info.group) == (user, sandbox.commands.run("id -gn").stdout.strip())
    assert {e.name: (e.owner, e.group) for e in sandbox.files.list("/")}["etc"] == ("root", "root")


def test_a_rename_moves_the_file_and_names_what_stops_it(sandbox: Sandbox) -> None:
    sandbox.files.write("/tmp/mv/old.txt", "moved")
    info = sandbox.files.rename("/tmp/mv/old.txt", "/tmp/mv/sub/new.txt")  # the destination's parents made
    assert (info.path, info.type) == ("/tmp/mv/sub/new.txt", FileType.FILE)
    assert sandbox.files.read("/tmp/mv/sub/new.txt") == "moved"
    assert not sandbox.files.exists("/tmp/mv/old.txt")
    with pytest.raises(FileNotFoundException, match="/tmp/mv/nothing does not exist"):
        sandbox.files.rename("/tmp/mv/nothing", "/tmp/mv/x")
    sandbox.files.make_dir("/tmp/mv/dir")
    with pytest.raises(InvalidArgumentException, match="/tmp/mv/dir is a directory"):
        sandbox.files.rename("/tmp/mv/sub/new.txt", "/tmp/mv/dir")
    sandbox.files.rename("/tmp/mv/sub/new.txt", "/../../../tmp/mv/up.txt")  # ".." stops at the sandbox's /
    assert sandbox.commands.run("cat /tmp/mv/up.txt").stdout == "moved"


def test_a_watch_reports_each_change_made_before_it_is_asked_and_is_bounded(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/tmp/watched/sub")
    handle = sandbox.files.watch_dir("/tmp/watched", recursive=True, include_entry=True)
    sandbox.files.write("/tmp/watched/sub/a.txt", "one")
    sandbox.files.rename("/tmp/watched/sub/a.txt", "/tmp/watched/b.txt")
    sandbox.commands.run("rm /tmp/watched/b.txt")
    events = handle.get_new_events()  # no waiting: each change above returned before the ask
    assert [(e.type.value, e.name) for e in events] == [
        ("create", "sub/a.txt"), ("chmod", "sub/a.txt"), ("write", "sub/a.txt"), ("rename", "sub/a.txt"),
        ("create", "b.txt"), ("remove", "b.txt")]
    assert events[0].entry is None  # gone since: no entry
    sandbox.files.write("/tmp/watched/c.txt", "")
    (created, _) = handle.get_new_events()
    assert created.entry is not None and created.entry.path == "/tmp/watched/c.txt"
    handle.stop()
    with pytest.raises(FileNotFoundException, match="/tmp/not-there"):
        sandbox.files.watch_dir("/tmp/not-there")
    with pytest.raises(InvalidArgumentException, match=r"/tmp/watched/c\.txt"):
        sandbox.files.watch_dir("/tmp/watched/c.txt")
    handles = [sandbox.files.watch_dir("/tmp/watched") for _ in range(MAX_PER_SANDBOX)]
    with pytest.raises(SandboxException, match=f"{MAX_PER_SANDBOX} directory watchers already"):
        sandbox.files.watch_dir("/tmp/watched")
    for h in handles:
        h.stop()
    sandbox.files.watch_dir("/tmp/watched").stop()  # room again


def test_metadata_is_kept_listed_moved_and_cleared_by_an_overwrite(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/tmp/meta/a.txt", "x", metadata={"Author": "ann", "purpose": "test"})
    assert info.metadata == {"author": "ann", "purpose": "test"}  # keys lowercased, as envd's
    assert sandbox.files.get_info("/tmp/meta/a.txt").metadata == info.metadata
    assert [e.metadata for e in sandbox.files.list("/tmp/meta")] == [info.metadata]
    assert sandbox.files.rename("/tmp/meta/a.txt", "/tmp/meta/b.txt").metadata == info.metadata
    assert sandbox.files.write("/tmp/meta/b.txt", "y").metadata is None
    assert sandbox.files.get_info("/tmp/meta/b.txt").metadata is None
    with pytest.raises(InvalidArgumentException, match=r"(?i)x-metadata-long: a metadata value is up to 1024"):
        sandbox.files.write("/tmp/meta/c.txt", "z", metadata={"long": "v" * 1025})
    assert not sandbox.files.exists("/tmp/meta/c.txt")  # refused before anything was written


def test_a_listing_carries_no_envd_token_and_a_get_does(e2b_env: E2bServer, sandbox: Sandbox) -> None:
    def get(path: str) -> object:
        req = urllib.request.Request(e2b_env.url + path, headers={"X-API-Key": KEY})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    listed = get("/v2/sandboxes")
    assert isinstance(listed, list) and listed and all("envdAccessToken" not in s for s in listed)
    one = get(f"/sandboxes/{sandbox.sandbox_id}")
    assert isinstance(one, dict) and one["envdAccessToken"] == sandbox._envd_access_token


def test_metadata_and_env_vars_reach_the_sandbox(e2b_env: E2bServer) -> None:
    sbx = Sandbox.create(metadata={"purpose": "e2b-test"}, envs={"FROM_CREATE": "yes"}, timeout=60)
    try:
        assert sbx.commands.run("echo $FROM_CREATE").stdout == "yes\n"
        found = Sandbox.list(query=SandboxQuery(metadata={"purpose": "e2b-test"})).next_items()
        assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
        assert found[0].metadata == {"purpose": "e2b-test"}
    finally:
        assert sbx.kill() is True
    assert sbx.sandbox_id not in [s.sandbox_id for s in Sandbox.list().next_items()]
    assert Sandbox.kill(sbx.sandbox_id) is False  # killed already: E2B's 404


def test_a_listing_paged_while_sandboxes_come_and_go_repeats_and_skips_none(e2b_env: E2bServer) -> None:
    """E2B's next token is a place in the listing, not a count: a sandbox made (newest first,
    before the page read) or killed between two pages shifts no later page."""
    tag = {"paging": str(time.monotonic_ns())}
    made = [Sandbox.create(timeout=60, metadata=tag) for _ in range(3)]
    try:
        def pages(after_first: Any) -> list[str]:
            paginator = Sandbox.list(query=SandboxQuery(metadata=tag), limit=2)
            seen = [s.sandbox_id for s in paginator.next_items()]
            after_first(seen)
            while paginator.has_next:
                seen += [s.sandbox_id for s in paginator.next_items()]
            return seen

        first = {s.sandbox_id for s in made}
        seen = pages(lambda _: made.append(Sandbox.create(timeout=60, metadata=tag)))
        assert sorted(seen) == sorted(first)  # the newer one came after the paging began
        seen = pages(lambda page: Sandbox.kill(page[0]))
        assert sorted(seen) == sorted({s.sandbox_id for s in made})
        status, answer = e2b_env.call("GET", "/v2/sandboxes?nextToken=2")
        assert status == 400 and answer["message"].startswith("nextToken: not a token this server gave")
    finally:
        for sbx in made:
            sbx.kill()


def test_on_timeout_pause_pauses_at_the_timeout_and_a_connect_resumes(e2b_env: E2bServer) -> None:
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("kept.txt", "still here")
        sbx.set_timeout(1)
        deadline = time.monotonic() + 30
        while sbx.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sbx.get_info().state.value == "paused"  # not killed
        resumed = sbx.connect()
        assert resumed.get_info().state.value == "running"
        assert resumed.files.read("kept.txt") == "still here"
        assert resumed.commands.run("echo awake").stdout == "awake\n"
    finally:
        sbx.kill()


def test_the_timeout_ends_a_sandbox_whose_command_still_runs(e2b_env: E2bServer) -> None:
    """E2B's timeout counts from when it was set, busy or not: a command running past it is
    ended with the sandbox (an idle timeout would have waited for it for ever)."""
    sbx = Sandbox.create(timeout=60)
    try:
        handle = sbx.commands.run("sleep 600", background=True)
        sbx.set_timeout(2)
        set_at = datetime.now(UTC)
        assert abs((sbx.get_info().end_at - set_at).total_seconds() - 2) < 1.5  # from the set, not the last event
        sbx.commands.run("true")  # activity does not move it
        deadline = time.monotonic() + 30
        while sbx.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sbx.is_running(), "still running 30 s after its 2 s timeout, a command in it"
        assert (datetime.now(UTC) - set_at).total_seconds() < 15
        with pytest.raises(TimeoutException, match="sandbox was killed or reached its end of life"):
            handle.wait()
    finally:
        sbx.kill()


def test_a_sandbox_to_pause_at_its_timeout_pauses_then_with_its_command_frozen(e2b_env: E2bServer) -> None:
    """As E2B's: past its timeout the sandbox pauses, its running command frozen with it, and
    the connect resumes the command where it was (it ends well, its output whole, on the
    stream opened before the pause)."""
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        # 40 steps of 0.1 s: work a freeze holds up (a single sleep's deadline would pass
        # while frozen, as the host's clock runs on: it would end as it thawed).
        handle = sbx.commands.run("for i in $(seq 40); do sleep 0.1; done; echo woke", background=True)
        sbx.set_timeout(1)
        deadline = time.monotonic() + 30
        while sbx.is_running() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sbx.get_info().state.value == "paused"
        time.sleep(4)  # past the command's 4 s, had it not been frozen
        sbx = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert handle.pid in {p.pid for p in sbx.commands.list()}  # still running
        done = handle.wait()  # its stream stayed open through the pause
        assert (done.exit_code, done.stdout) == (0, "woke\n")
    finally:
        sbx.kill()


def test_a_pause_answers_409_only_for_a_paused_sandbox(e2b_env: E2bServer) -> None:
    """E2B's SDK takes a 409 for "already paused" (pause() returns False); a killed sandbox is
    not found, as E2B's."""
    sbx = Sandbox.create(timeout=60)
    try:
        assert sbx.pause() is True
        assert sbx.pause() is False  # already paused: E2B's 409
        assert sbx.get_info().state.value == "paused"
    finally:
        sbx.kill()
    with pytest.raises(NotFoundException):
        sbx.pause()


_COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"
_GET = "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/').status)\""


def test_a_sandbox_pauses_with_its_commands_and_resumes_them_where_they_were(e2b_env: E2bServer) -> None:
    """E2B's pause: the sandbox's commands (a counter, an http.server) are frozen with it and
    carry on after the connect, the same processes; the counter did not count while paused.
    (A command's time limit standing still while paused: tests/api/test_lifecycle.py.)"""
    sbx = Sandbox.create(timeout=120)
    try:
        counter = sbx.commands.run(_COUNTER, background=True)
        server = sbx.commands.run("python3 -m http.server 8000", background=True)
        deadline = time.monotonic() + 30
        while sbx.commands.run(_GET + " || true").stdout != "200\n" and time.monotonic() < deadline:
            time.sleep(0.2)
        before, t0 = int(sbx.commands.run("cat /tmp/count").stdout), time.monotonic()
        assert sbx.pause() is True
        paused_from = time.monotonic()
        assert sbx.get_info().state.value == "paused"
        time.sleep(3)
        paused_for = time.monotonic() - paused_from
        sbx = Sandbox.connect(sbx.sandbox_id)
        after, awake = int(sbx.commands.run("cat /tmp/count").stdout), time.monotonic() - t0 - paused_for
        assert sbx.get_info().state.value == "running"
        # At most one count per 0.2 s awake (plus one in progress): none while frozen.
        assert after - before <= awake / 0.2 + 2, (before, after, awake, paused_for)
        assert sbx.commands.run(_GET).stdout == "200\n"  # the same server, still listening
        time.sleep(0.6)
        assert int(sbx.commands.run("cat /tmp/count").stdout) > after  # counting again
        listed = {p.pid for p in sbx.commands.list()}
        assert {counter.pid, server.pid} <= listed
    finally:
        sbx.kill()


def test_an_mcp_gateway_the_template_lacks_fails_the_create_and_kills_it(e2b_env: E2bServer) -> None:
    """``mcp`` is the SDK's to start in the sandbox: hutch's runtimes have no mcp-gateway, so the
    create raises and leaves no sandbox; E2B's mcp-gateway template (the SDK's default with
    ``mcp``) is not hutch's; an ``mcp`` that is no object is a 400 naming it."""
    tag = {"mcp_test": str(time.monotonic_ns())}
    servers: dict[str, dict[str, str]] = {"invalid_server": {}}
    with pytest.raises(SandboxException, match=r"Failed to start MCP gateway: .*mcp-gateway: command not found"):
        Sandbox.create("base", timeout=60, metadata=tag, mcp=servers)  # type: ignore[arg-type]
    assert Sandbox.list(query=SandboxQuery(metadata=tag)).next_items() == []
    with pytest.raises(SandboxException, match="404: template 'mcp-gateway' not found"):
        Sandbox.create(timeout=60, metadata=tag, mcp=servers)  # type: ignore[arg-type]
    status, answer = e2b_env.call("POST", "/sandboxes", {"templateID": "base", "mcp": "github"})
    assert status == 400 and answer["message"].startswith("mcp: expected an object")


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def test_a_filesystem_only_pause_ends_its_processes_keeps_its_files_and_reboots(e2b_env: E2bServer) -> None:
    """``pause(mode="filesystem")`` (``keep_memory=False``): every process ends (a command
    running then ends with the sandbox's pause, its stream closed), the files stay, and the
    connect cold-boots it: the same id and envd token, nothing of the old processes, a new
    boot id. A second pause of it is E2B's 409 (``False``)."""
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/marker.txt", "persisted")
        boot = sbx.files.read(BOOT_ID).strip()
        sleeper = sbx.commands.run("sleep 600", background=True)
        assert sbx.pause(mode="filesystem") is True
        assert not sbx.is_running() and sbx.get_info().state.value == "paused"
        assert sbx.pause(keep_memory=False) is False  # already paused
        with pytest.raises(CommandExitException):
            sleeper.wait()  # it ended with the pause, not frozen
        resumed = sbx.connect()
        assert resumed.sandbox_id == sbx.sandbox_id and resumed.is_running()
        assert resumed.files.read("/home/user/marker.txt") == "persisted"
        assert resumed.files.read(BOOT_ID).strip() != boot
        assert sleeper.pid not in {p.pid for p in resumed.commands.list()}
        assert resumed.commands.run("echo awake").stdout == "awake\n"
        # A pause with the memory kept keeps the boot (and its processes).
        rebooted = resumed.files.read(BOOT_ID).strip()
        assert resumed.pause() is True
        assert sbx.connect().files.read(BOOT_ID).strip() == rebooted
    finally:
        sbx.kill()


def test_on_timeout_a_filesystem_only_pause_keeps_the_files_and_reboots(e2b_env: E2bServer) -> None:
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        sbx.files.write("kept.txt", "still here")
        boot = sbx.files.read(BOOT_ID).strip()
        sbx.set_timeout(1)
        deadline = time.monotonic() + 30
        while sbx.get_info().state.value != "paused" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sbx.get_info().state.value == "paused"  # not killed
        resumed = sbx.connect()
        assert resumed.files.read("kept.txt") == "still here"
        assert resumed.files.read(BOOT_ID).strip() != boot
    finally:
        sbx.kill()


def test_a_filesystem_only_pause_with_auto_resume_is_refused_naming_it(e2b_env: E2bServer) -> None:
    """E2B's SDK refuses the pair before sending; a client that sends it anyway gets E2B's 400."""
    status, answer = e2b_env.call("POST", "/sandboxes", {"templateID": "base", "autoPause": True,
                                                         "autoPauseMemory": False,
                                                         "autoResume": {"enabled": True}})
    assert status == 400 and answer["message"].startswith("autoResume: a sandbox paused filesystem-only"), answer


def test_a_create_repeated_with_its_idempotency_key_makes_one_sandbox(e2b_env: E2bServer) -> None:
    first = Sandbox.create(timeout=60, idempotency_key="e2b-test-once")
    try:
        again = Sandbox.create(timeout=60, idempotency_key="e2b-test-once")
        assert again.sandbox_id == first.sandbox_id
        assert Sandbox.create(timeout=60, idempotency_key="e2b-test-other").kill() is True  # another key: another
    finally:
        first.kill()
    with pytest.raises(SandboxException, match="has ended; use a new key"):
        Sandbox.create(timeout=60, idempotency_key="e2b-test-once")


def test_a_missing_sandbox_or_template_is_the_sdks_not_found(e2b_env: E2bServer) -> None:
    with pytest.raises(NotFoundException):
        Sandbox.get_info("sbx_doesnotexist")
    with pytest.raises(SandboxException, match="template 'no-such-template' not found"):
        Sandbox.create(template="no-such-template")


def test_a_bad_key_is_refused_in_e2bs_shape(e2b_env: E2bServer) -> None:
    with pytest.raises(AuthenticationException, match="invalid API key"):
        Sandbox.list(api_key="not-a-key").next_items()


def test_another_organizations_key_reaches_nothing_on_either_plane(e2b_env: E2bServer, sandbox: Sandbox) -> None:
    """Org B's key cannot see, kill or connect to org A's sandbox; B's envd token (for B's own
    sandbox) opens nothing of A's, and neither does a forged one."""
    other = e2b_env.key_of_new_org("e2bother")
    assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(api_key=other).next_items()]
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=other)
    assert Sandbox.kill(sandbox.sandbox_id, api_key=other) is False
    with pytest.raises(SandboxException):
        Sandbox.connect(sandbox.sandbox_id, api_key=other)
    theirs = Sandbox.create(api_key=other, timeout=60)
    try:
        # B's client, with B's valid token, aimed at A's sandbox by its id.
        stolen = Sandbox(sandbox_id=sandbox.sandbox_id, sandbox_domain=None,  # type: ignore[call-arg]
                         envd_version=theirs._envd_version, envd_access_token=theirs._envd_access_token,
                         connection_config=_config_for(sandbox.sandbox_id, theirs._envd_access_token))
        with pytest.raises(AuthenticationException):
            stolen.commands.run("echo pwned")
        forged = Sandbox(sandbox_id=sandbox.sandbox_id, sandbox_domain=None,  # type: ignore[call-arg]
                         envd_version=theirs._envd_version, envd_access_token="k.forged",
                         connection_config=_config_for(sandbox.sandbox_id, "k.forged"))
        with pytest.raises(AuthenticationException):
            forged.commands.list()
        with pytest.raises(AuthenticationException):
            stolen.files.read("/etc/hostname")
        with pytest.raises(AuthenticationException):
            stolen.files.write("/tmp/planted", "x")
    finally:
        theirs.kill()
    assert sandbox.is_running()


def test_metrics_show_the_memory_a_sandbox_holds_to_its_organization_only(e2b_env: E2bServer,
                                                                         sandbox: Sandbox) -> None:
    """E2B's get_metrics reads the sandbox now: a shell holding 64 MiB shows in memUsed; a time
    range without now has no sample; another organization's key finds no such sandbox."""
    before = sandbox.get_metrics()
    assert len(before) == 1
    # bash fills its variable by reading and growing a buffer: seconds on a loaded machine.
    holder = sandbox.commands.run("x=$(head -c 67108864 /dev/zero | tr '\\0' a); sleep 120", background=True)
    try:
        deadline, now, read_at = time.monotonic() + 60, before[0], time.time()
        while now.mem_used < before[0].mem_used + 64 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.2)
            now, read_at = sandbox.get_metrics()[0], time.time()
        assert now.mem_used >= before[0].mem_used + 64 * 2**20, (before[0], now)
    finally:
        holder.kill()
    assert 0 <= now.mem_cache < now.mem_used <= now.mem_total
    assert 0 < now.disk_used < now.disk_total and now.cpu_count >= 1 and 0 <= now.cpu_used_pct <= 100
    assert abs(now.timestamp.timestamp() - read_at) < 5  # when it was read: the kill above may take long
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    assert sandbox.get_metrics(start=an_hour_ago, end=an_hour_ago + timedelta(minutes=1)) == []
    other = e2b_env.key_of_new_org("e2bmetrics")
    with pytest.raises(NotFoundException):
        Sandbox.get_metrics(sandbox.sandbox_id, api_key=other)
    # Many at once (the SDK has no call for it): the other organization's key sees none of them.
    for key, seen in ((KEY, [sandbox.sandbox_id]), (other, [])):
        request = urllib.request.Request(f"{e2b_env.url}/sandboxes/metrics?sandbox_ids={sandbox.sandbox_id},sbx_nope",
                                         headers={"X-API-Key": key})
        with urllib.request.urlopen(request) as answer:
            assert list(json.load(answer)["sandboxes"]) == seen


def test_a_metrics_range_that_is_no_range_is_refused_naming_the_field(e2b_env: E2bServer, sandbox: Sandbox) -> None:
    for query, field in (("start=yesterday", "start"), ("start=20&end=10", "start")):
        request = urllib.request.Request(f"{e2b_env.url}/sandboxes/{sandbox.sandbox_id}/metrics?{query}",
                                         headers={"X-API-Key": KEY})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request)
        assert caught.value.code == 400 and field in json.load(caught.value)["message"]


def _config_for(sandbox_id: str, token: str | None):  # type: ignore[no-untyped-def]
    from e2b.connection_config import ConnectionConfig

    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token:
        headers["X-Access-Token"] = token
    return ConnectionConfig(extra_sandbox_headers=headers)


async def test_the_async_sdk_runs_a_command_and_kills(e2b_env: E2bServer) -> None:
    sbx = await AsyncSandbox.create(timeout=60)
    try:
        result = await sbx.commands.run("echo async; exit 0")
        assert (result.stdout, result.exit_code) == ("async\n", 0)
        with pytest.raises(CommandExitException) as caught:
            await sbx.commands.run("exit 7")
        assert caught.value.exit_code == 7
    finally:
        assert await sbx.kill() is True
    with pytest.raises(NotFoundException):
        await AsyncSandbox.get_info(sbx.sandbox_id)
