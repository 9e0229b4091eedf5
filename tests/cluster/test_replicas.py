"""Two API replicas (``hutch serve``) on one Kafka topic and one PostgreSQL database over the
real cluster (core/replicas.py, api/replication.py): requests alternate between them, a
sandbox made through one is driven through the other, every event is appended once, and
after a kill -9 of one the other takes its sandboxes over: their running executions end
``failed`` naming the lost replica, their output stays readable, the sandboxes keep
working, and the killed replica coming back takes nothing back."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hutch import SyncSandboxClient
from hutch.core.replicas import LEASE_SECONDS, RENEW_SECONDS
from tests.cluster.conftest import Cluster
from tests.services import drop_database, drop_topics, fresh_database, kafka_url
from tests.system.server import KEY, Server

TAKE_OVER_LIMIT = 30.0  # seconds from the kill to the lost replica's execution ending failed


class Pair:
    def __init__(self, a: Server, b: Server) -> None:
        self.a, self.b = a, b

    def either(self, n: int) -> Server:
        return (self.a, self.b)[n % 2]


@pytest.fixture
def pair(cluster: Cluster, tmp_path: Path) -> Iterator[Pair]:
    url, database = asyncio.run(fresh_database("replicas"))
    log = kafka_url("replicas")
    servers = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        servers.append(Server(tmp_path / name, driver="nomad", HUTCH_NOMAD_ADDR=cluster.addr, HUTCH_NOMAD_TOKEN=cluster.token,
                              HUTCH_NOMAD_REGISTRY=cluster.registry, HUTCH_EVENT_LOG=log, HUTCH_STORE=url,
                              HUTCH_NOMAD_POOL="off", HUTCH_REPLICA_ID=f"replica-{name}", HUTCH_SSH_PORT="0"))
    try:
        for srv in servers:
            srv.start(timeout=120)
        yield Pair(*servers)
    finally:
        try:
            destroy_all(servers)
        finally:
            for srv in servers:
                srv.stop()
            asyncio.run(drop_database(database))
            asyncio.run(drop_topics(log))


def destroy_all(servers: list[Server]) -> None:
    """Through a replica still serving (one may be dead, or exiting after it was claimed):
    nothing the test made outlives it."""
    for srv in servers:
        if srv.proc is None or srv.proc.poll() is not None:
            continue
        try:
            srv.call("GET", "/healthz", timeout=10)
        except (urllib.error.URLError, ConnectionError):
            continue
        srv.destroy_every_sandbox()
        return


def run(server: Server, sid: str, command: list[str]) -> dict[str, Any]:
    """Execute and wait for the end; the finished execution."""
    started = server.data("POST", f"/sandbox/{sid}/execute", {"command": command, "timeout": "60s"}, timeout=90)
    done: dict[str, Any] = server.data("GET", f"/sandbox/execution/{started['executionId']}?wait=60s", timeout=90)
    assert done["status"] not in ("queued", "running"), done
    return done


def read(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        data: bytes = resp.read()
        return data


def event_types(server: Server, sid: str) -> Counter[str]:
    events = server.data("GET", f"/sandbox/sandboxes/{sid}/events?limit=100")
    items = events if isinstance(events, list) else events.get("events", [])
    return Counter(e.get("type") or e.get("eventType") for e in items)


def test_a_sandbox_made_through_one_replica_is_driven_through_the_other(pair: Pair, cluster: Cluster) -> None:
    sid = pair.a.data("POST", "/sandbox", {"runtime": "python:3.13"}, timeout=300)["sandboxId"]
    job = next(a["JobID"] for a in cluster.allocs_of(sid))
    # B has never seen it: everything that needs the sandbox's driver is relayed to A.
    for n in range(4):
        done = run(pair.either(n + 1), sid, ["sh", "-c", f"echo turn {n}"])
        assert done["exitCode"] == 0, done
        assert read(done["stdoutStreamUrl"]) == f"turn {n}\n".encode()
    with SyncSandboxClient(pair.b.url, KEY) as client:
        sb = client.connect(sid)
        sb.write_files({"through-b.txt": b"written through B"})
    with SyncSandboxClient(pair.a.url, KEY) as client:
        assert client.connect(sid).read_bytes("through-b.txt") == b"written through B"
    assert pair.b.call("POST", f"/sandbox/{sid}/pause")[0] == 200
    assert pair.a.data("GET", f"/sandbox/{sid}")["status"] == "paused"
    assert pair.a.call("POST", f"/sandbox/{sid}/resume")[0] == 200
    assert pair.b.data("GET", f"/sandbox/{sid}")["status"] == "idle"
    assert run(pair.b, sid, ["true"])["exitCode"] == 0
    status, _ = pair.b.call("DELETE", f"/sandbox/{sid}", timeout=60)
    assert status in (200, 204), status
    assert pair.a.call("GET", f"/sandbox/{sid}")[0] == 404  # deleted, as A's projection shows too
    # Each operation was recorded once, whichever replica took the request.
    types = event_types(pair.b, sid)
    assert types["lifecycle:started"] == 1 and types["pause"] == 1 and types["resume"] == 1, types
    assert types["execution:started"] == 5 and types["execution:finished"] == 5, types
    assert types["lifecycle:terminated"] == 1, types
    assert job.startswith("hutch-"), job  # placed by A's driver, destroyed through B via A
    deadline = time.monotonic() + 30
    while any(a["ClientStatus"] == "running" for a in cluster.allocs_of(sid)):
        assert time.monotonic() < deadline, cluster.allocs_of(sid)
        time.sleep(0.5)


def test_a_killed_replica_s_sandboxes_are_taken_over(pair: Pair, cluster: Cluster) -> None:
    sid = pair.a.data("POST", "/sandbox", {"runtime": "python:3.13"}, timeout=300)["sandboxId"]
    other = pair.b.data("POST", "/sandbox", {"runtime": "python:3.13"}, timeout=300)["sandboxId"]
    running = pair.a.data("POST", f"/sandbox/{sid}/execute",
                          {"command": ["sh", "-c", "echo before the loss; sleep 600"]})
    stdout = running["stdoutStreamUrl"].replace(pair.a.url, pair.b.url)
    with urllib.request.urlopen(stdout, timeout=30) as resp:  # through B while A runs it
        assert resp.read(16) == b"before the loss\n"

    killed = time.monotonic()
    pair.a.kill9()
    # B notices within the lease, ends the execution naming A, and drives the sandbox from then on.
    ex = pair.b.data("GET", f"/sandbox/execution/{running['executionId']}?wait=30s", timeout=40)
    took = time.monotonic() - killed
    assert ex["status"] == "failed" and "replica-a" in (ex.get("error") or ""), ex
    assert took < TAKE_OVER_LIMIT, took
    print(f"take-over: the lost replica's execution ended {took:.1f}s after the kill")
    # Its output up to the loss, then the end, through B.
    assert read(stdout) == b"before the loss\n"
    done = run(pair.b, sid, ["sh", "-c", "echo after the loss"])
    assert done["exitCode"] == 0 and read(done["stdoutStreamUrl"]) == b"after the loss\n", done
    assert run(pair.b, other, ["true"])["exitCode"] == 0
    assert event_types(pair.b, sid)["execution:finished"] == 2

    # A comes back (same data dir, same replica id): the sandbox stays B's and keeps running.
    pair.a.start(timeout=120)
    assert run(pair.a, sid, ["sh", "-c", "echo relayed"])["exitCode"] == 0
    assert [a["ClientStatus"] for a in cluster.allocs_of(sid)] == ["running"], cluster.allocs_of(sid)
    status, _ = pair.a.call("DELETE", f"/sandbox/{sid}", timeout=60)
    assert status in (200, 204), status
    assert pair.b.call("GET", f"/sandbox/{sid}")[0] == 404


def test_a_replica_stopped_on_purpose_hands_its_sandboxes_over_at_once(pair: Pair) -> None:
    sid = pair.a.data("POST", "/sandbox", {"runtime": "python:3.13"}, timeout=300)["sandboxId"]
    pair.a.stop()
    started = time.monotonic()
    done = run(pair.b, sid, ["sh", "-c", "echo still here"])  # claims it: A's lease ended with A
    assert done["exitCode"] == 0 and read(done["stdoutStreamUrl"]) == b"still here\n", done
    assert time.monotonic() - started < 10
    assert pair.b.data("GET", f"/sandbox/{sid}")["status"] in ("idle", "running")


def test_stdin_uploaded_through_one_replica_feeds_a_command_run_by_the_other(pair: Pair) -> None:
    sid = pair.b.data("POST", "/sandbox", {"runtime": "python:3.13"}, timeout=300)["sandboxId"]
    made = pair.a.call("POST", "/streams", {"name": "input"})[1]
    stream_id = made["id"]
    assert stream_id.endswith(".replica-a"), stream_id  # it lives in A
    # The upload reaches B, which relays it to A; the command runs in B (the sandbox's owner)
    # and reads the bytes from A.
    req = urllib.request.Request(f"{pair.b.url}/streams/{stream_id}", data=b"fed through A\n", method="PUT",
                                 headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    started = pair.a.data("POST", f"/sandbox/{sid}/execute",
                          {"command": ["cat"], "stream": {"stdin": stream_id}, "timeout": "60s"}, timeout=90)
    done = pair.a.data("GET", f"/sandbox/execution/{started['executionId']}?wait=60s", timeout=90)
    assert done["exitCode"] == 0, done
    assert read(done["stdoutStreamUrl"]) == b"fed through A\n"
    # Without the replicas' token, nobody else reads a stream.
    other = pair.a.call("POST", "/streams", {})[1]["id"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{pair.a.url}/streams/{other}/stdin", timeout=10)
    assert refused.value.code == 404
    refused.value.close()


def test_a_sandbox_quota_holds_across_replicas(pair: Pair) -> None:
    """Creates of one organization reaching both replicas at once: the quota's check and the
    create it allows are one across replicas too (Replicas.serialised), so no more sandboxes
    are made than the quota allows, whichever replica took each request."""
    limit, attempts = 1, 6  # 1: the first create through each replica is the race
    pair.a.data("POST", "/orgs", {"name": "quota"})
    admin = pair.a.data("POST", "/keys?orgId=org_quota", {"role": "admin"})["secret"]
    headers = {"Authorization": f"Bearer {admin}"}
    pair.a.data("PATCH", "/orgs/org_quota/quota", {"sandboxes": limit})
    deadline = time.monotonic() + 10
    while pair.b.data("GET", "/orgs/org_quota")["quota"].get("sandboxes") != limit:  # B has seen it
        assert time.monotonic() < deadline
        time.sleep(0.05)

    async def create(session: aiohttp.ClientSession, server: Server) -> tuple[int, Any]:
        async with session.post(f"{server.url}/sandbox", json={"runtime": "base:latest"}, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=300)) as resp:
            return resp.status, await resp.json()

    async def race() -> list[tuple[int, Any]]:
        async with aiohttp.ClientSession() as session:
            return list(await asyncio.gather(*(create(session, pair.either(n)) for n in range(attempts))))

    answers = asyncio.run(race())
    made = [body["data"]["sandboxId"] for status, body in answers if status == 201]
    refused = [body for status, body in answers if status != 201]
    assert len(made) == limit, answers
    assert all(body["code"] == "QUOTA_EXCEEDED" for body in refused), refused
    assert pair.b.data("GET", "/orgs/org_quota")["usage"]["sandboxes"] == limit


def test_a_replica_back_from_a_stall_serves_nothing_it_lost(pair: Pair) -> None:
    """A frozen replica (SIGSTOP past its lease) is taken over; thawed, it must not act on the
    sandboxes it still remembers as its own before its next renewal tells it it lost them:
    its lease is not current, so it asks the store, and relays to the new owner."""
    sid = pair.a.data("POST", "/sandbox", {"runtime": "base:latest"}, timeout=300)["sandboxId"]
    assert execute_through(pair.a, sid)[1] == "replica-a"
    assert pair.a.proc is not None
    os.kill(pair.a.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(LEASE_SECONDS + 3 * RENEW_SECONDS)  # the lease runs out; B claims A's sandboxes
    finally:
        os.kill(pair.a.proc.pid, signal.SIGCONT)
    try:
        status, served_by = execute_through(pair.a, sid)
    except (urllib.error.URLError, ConnectionError):  # A found itself claimed and went first
        status, served_by = 0, None
    # A may refuse (503: it learnt it was claimed, or its lease lapsed) or relay to B; it must
    # not run the command itself.
    assert status in (0, 200, 503), (status, served_by)
    assert not (status == 200 and served_by == "replica-a"), "the thawed replica acted on a sandbox B owns"
    print(f"thawed replica-a answered {status} from {served_by}")
    assert execute_through(pair.b, sid) == (200, "replica-b")


def execute_through(server: Server, sid: str) -> tuple[int, str | None]:
    """POST execute of `true`; the status and which replica answered (X-Hutch-Replica)."""
    req = urllib.request.Request(f"{server.url}/sandbox/{sid}/execute", data=json.dumps({"command": ["true"]}).encode(),
                                 method="POST", headers={"Authorization": f"Bearer {KEY}",
                                                         "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("X-Hutch-Replica")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("X-Hutch-Replica")


def test_ssh_through_one_replica_reaches_a_sandbox_the_other_owns(pair: Pair, tmp_path: Path) -> None:
    """OpenSSH's own ssh, scp and sftp through replica A's gateway, into a sandbox B owns:
    relayed to B's gateway whole (api/ssh_relay.py), as HTTP requests are."""
    sid = pair.b.data("POST", "/sandbox", {"runtime": "base:latest"}, timeout=300)["sandboxId"]
    key = tmp_path / "id_relay"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    pair.a.data("POST", "/ssh-keys", {"publicKey": key.with_suffix(".pub").read_text()})
    port = pair.a.data("GET", "/healthz")["ssh"]["port"]
    opts = ["-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "-o", "LogLevel=ERROR"]

    def ssh(*argv: str, stdin: bytes = b"", tty: bool = False) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["ssh", *opts, "-tt" if tty else "-T", "-p", str(port), f"{sid}@127.0.0.1", *argv],
                              input=stdin, capture_output=True, timeout=120)

    done = ssh("echo out; echo err >&2; cat; exit 7", stdin=b"piped in\n")
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\npiped in\n", b"err\n"), done
    shell = ssh(tty=True, stdin=b"echo sum-$((2+3)); tty\nexit 4\n")  # a login shell on a terminal
    assert shell.returncode == 4 and b"sum-5" in shell.stdout and b"/dev/pts/" in shell.stdout, shell
    payload = os.urandom(200_000)
    (tmp_path / "up.bin").write_bytes(payload)
    scp = ["scp", *opts, "-P", str(port)]
    up = subprocess.run([*scp, str(tmp_path / "up.bin"), f"{sid}@127.0.0.1:up.bin"], capture_output=True, timeout=120)
    assert up.returncode == 0, up
    back = subprocess.run([*scp, f"{sid}@127.0.0.1:up.bin", str(tmp_path / "down.bin")], capture_output=True,
                          timeout=120)
    assert back.returncode == 0 and (tmp_path / "down.bin").read_bytes() == payload, back
    (tmp_path / "batch").write_text("mkdir made\nput " + str(tmp_path / "up.bin") + " made/again.bin\nls made\n")
    sftp = subprocess.run(["sftp", *opts, "-P", str(port), "-b", str(tmp_path / "batch"), f"{sid}@127.0.0.1"],
                          capture_output=True, timeout=120)
    assert sftp.returncode == 0 and b"again.bin" in sftp.stdout, sftp
    with SyncSandboxClient(pair.b.url, KEY) as client:  # the files landed in B's sandbox
        assert client.connect(sid).read_bytes("made/again.bin") == payload
    # Served by B: every session came to B's gateway as a relay, none was run by A itself.
    relayed = pair.b.log.read_text().count(f"Auth for user replica-relay.{sid} succeeded")
    assert relayed == 5, relayed  # ssh, ssh -tt, scp up, scp down, sftp
    assert f"Auth for user {sid} succeeded" not in pair.b.log.read_text()

    # The user hanging up ends the far session too, as it ends a session on B's own gateway
    # (a relay that held B's side open would leave the shell, and the hop, running).
    shell_at_b = subprocess.Popen(["ssh", *opts, "-tt", "-p", str(port), f"{sid}@127.0.0.1"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert shell_at_b.stdin is not None and shell_at_b.stdout is not None
        shell_at_b.stdin.write(b"echo shell-$((6*7))\n")
        shell_at_b.stdin.flush()
        seen = b""
        while b"shell-42" not in seen:  # the shell runs on B
            seen += shell_at_b.stdout.read1(4096) or b""
    finally:
        shell_at_b.kill()
        shell_at_b.wait()
        for pipe in (shell_at_b.stdin, shell_at_b.stdout):
            if pipe is not None:
                pipe.close()
    hop = re.findall(rf"\[(conn=\d+)\] Beginning auth for user replica-relay\.{sid}", pair.b.log.read_text())[-1]
    deadline = time.monotonic() + 20
    while f"[{hop}, chan=0] Channel closed" not in pair.b.log.read_text():
        assert time.monotonic() < deadline, f"the hop to B ({hop}) outlived the user hanging up"
        time.sleep(0.2)


def test_a_command_whose_waiters_left_through_the_other_replica_is_cancelled(pair: Pair) -> None:
    """api/watchers.py across replicas: the client long-polls a command A runs, and reads its
    output, through B, then goes away. Both waits were relayed to A (the replica running it),
    so A sees its waiters leave and cancels the command after the grace, as on one replica."""
    sid = pair.a.data("POST", "/sandbox", {"runtime": "base:latest"}, timeout=300)["sandboxId"]
    started = pair.a.data("POST", f"/sandbox/{sid}/execute", {"command": ["sh", "-c", "echo up; sleep 600"]})
    execution_id = started["executionId"]
    stdout = started["stdoutStreamUrl"].replace(pair.a.url, pair.b.url)
    with urllib.request.urlopen(stdout, timeout=30) as resp:  # a reader through B, left mid-stream
        assert resp.read(3) == b"up\n"
    port = int(pair.b.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:  # a long-poll, dropped
        sock.sendall(f"GET /sandbox/execution/{execution_id}?wait=60s HTTP/1.1\r\nHost: b\r\n"
                     f"Authorization: Bearer {KEY}\r\n\r\n".encode())
        time.sleep(1)
    deadline = time.monotonic() + 30
    while (ex := pair.b.data("GET", f"/sandbox/execution/{execution_id}"))["status"] == "running":
        assert time.monotonic() < deadline, "the command ran on after its waiters left through B"
        time.sleep(0.5)  # polls without `wait` are no waiters
    assert ex["status"] == "cancelled" and "went away" in (ex.get("error") or ""), ex
