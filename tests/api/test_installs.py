"""Create-time installs: apt ``dependencies`` and npm ``packages`` (a shared, cached install
layer under the sandbox's own, drivers/local/layers.py; on nomad, a derived image with that
layer), through the wire."""

from __future__ import annotations

import pytest

from tests.api.conftest import AUTH, NODE, REAL, WIRE, Api


async def run(api: Api, sid: str, *argv: str) -> tuple[int, bytes]:
    ex = await api.data("POST", f"/sandbox/{sid}/execute", json={"command": list(argv)})
    done = await api.wait_execution(ex["executionId"])
    return done["exitCode"], await api.stream(ex["stdoutStreamUrl"])


@pytest.mark.runs_on(*REAL, *NODE)  # the real drivers' install layers (node: prepared on the node it lands on)
async def test_dependencies_and_packages_are_installed_and_shared(api: Api) -> None:
    body = {"runtime": "base:latest", "dependencies": ["jq"], "packages": ["json@11.0.0"]}
    first = (await api.call("POST", "/sandbox", json=body, expect=201))["data"]["sandboxId"]
    code, out = await run(api, first, "sh", "-c", "jq --version; echo '{\"a\":[1,2]}' | jq -c .a")
    assert code == 0 and out.startswith(b"jq-1.") and out.endswith(b"[1,2]\n"), out
    code, out = await run(api, first, "cat", "/usr/local/lib/node_modules/json/package.json")
    assert code == 0 and b'"version": "11.0.0"' in out
    info = await api.data("GET", f"/sandbox/{first}")
    assert info["dependencies"] == ["jq"] and info["packages"] == ["json@11.0.0"]
    # The sandbox user still cannot change what was installed (it is root's, read-only below).
    code, _ = await run(api, first, "sh", "-c", "echo x > /usr/bin/jq")
    assert code != 0
    # A second sandbox asking the same reuses the layer; a plain one does not see it.
    second = (await api.call("POST", "/sandbox", json=body, expect=201))["data"]["sandboxId"]
    assert (await run(api, second, "jq", "--version"))[0] == 0
    plain = (await api.call("POST", "/sandbox", json={"runtime": "base:latest"}, expect=201))["data"]["sandboxId"]
    assert (await run(api, plain, "sh", "-c", "command -v jq"))[0] != 0
    # Checkpoint and restore keep the install layer underneath.
    cp = (await api.call("POST", f"/sandbox/{first}/checkpoint", json={"name": "c"}, expect=201))["data"]
    await api.call("POST", f"/sandbox/{first}/checkpoint/{cp['id']}/restore")
    assert (await run(api, first, "jq", "--version"))[0] == 0
    # A snapshot of it brings the installs to the sandboxes made from it.
    snap = await api.data("POST", f"/sandbox/{first}/snapshot", json={"name": "withjq"}, expect=201)
    assert snap["dependencies"] == ["jq"]
    child = (await api.call("POST", "/sandbox", json={"snapshot": "withjq"}, expect=201))["data"]["sandboxId"]
    assert (await run(api, child, "jq", "--version"))[0] == 0


@pytest.mark.runs_on(*REAL, *NODE)  # the real drivers look the names up (node: on the reserved node, nothing recorded)
async def test_a_package_that_does_not_exist_creates_nothing(api: Api) -> None:
    before = (await api.data("GET", "/sandbox"))["total"]
    err = await api.call("POST", "/sandbox", json={"runtime": "base:latest", "dependencies": ["no-such-pkg-hutch"]},
                         expect=400)
    assert err["field"] == "dependencies" and "no-such-pkg-hutch" in err["message"], err
    err = await api.call("POST", "/sandbox", json={"runtime": "base:latest",
                                                   "packages": ["@hutch-nonexistent/nothing-here"]}, expect=400)
    assert err["field"] == "packages", err
    for body, field in (({"dependencies": ["-o"]}, "dependencies"), ({"dependencies": "jq"}, "dependencies"),
                        ({"dependencies": ["jq; reboot"]}, "dependencies"), ({"packages": ["--prefix=/"]}, "packages"),
                        ({"packages": ["a b"]}, "packages"), ({"packages": [7]}, "packages"),
                        # Only registry packages: these would make the host's npm read host files
                        # (into the sandbox) or use the host's git credentials.
                        ({"packages": ["file:/etc"]}, "packages"), ({"packages": ["/root/.ssh"]}, "packages"),
                        ({"packages": ["git+ssh://git@github.com/x/y.git"]}, "packages"),
                        ({"packages": ["alias@npm:left-pad"]}, "packages"),
                        ({"packages": ["https://evil.example/x.tgz"]}, "packages"), ({"packages": ["../x"]}, "packages")):
        err = await api.call("POST", "/sandbox", json=body, expect=400)
        assert err["field"] == field, (body, err)
    assert (await api.data("GET", "/sandbox"))["total"] == before  # no sandbox, not even a failed one


@pytest.mark.runs_on(*REAL)  # the real drivers' install layers
async def test_snapshot_build_installs_dependencies(api: Api) -> None:
    init = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "name": "tools"},
                          expect=201)
    done = await api.data("POST", f"/sandbox/snapshots/{init['snapshotId']}/finalize",
                          json={"dependencies": ["jq"], "env": {"TOOLS": "1"}})
    assert done["dependencies"] == ["jq"] and done["fileCount"] == 0
    sid = (await api.call("POST", "/sandbox", json={"snapshot": "tools"}, expect=201))["data"]["sandboxId"]
    assert (await run(api, sid, "jq", "--version"))[0] == 0
    bad = await api.data("POST", "/sandbox/snapshots/build", json={"runtime": "base:latest", "name": "bad"},
                         expect=201)
    err = await api.call("POST", f"/sandbox/snapshots/{bad['snapshotId']}/finalize",
                         json={"dependencies": ["no-such-pkg-hutch"]}, expect=400)
    assert err["field"] == "dependencies"
    await api.call("GET", f"/sandbox/snapshots/{bad['snapshotId']}", expect=404)  # still not a snapshot


@pytest.mark.runs_on(*WIRE)  # the fake driver refuses them
async def test_drivers_without_installs_say_so(api: Api) -> None:
    err = await api.call("POST", "/sandbox", json={"dependencies": ["jq"]}, expect=501)
    assert err["field"] == "dependencies" and "fake" in err["message"]
    resp = await api.client.get("/sandbox", headers=AUTH)
    assert (await resp.json())["data"]["total"] == 0


@pytest.mark.runs_on(*REAL)  # the real drivers' accounting
async def test_stats_count_cpu_and_memory_time(api: Api) -> None:
    """Usage is read from the driver's accounting (cgroups on the local driver) as a sandbox
    ends, logged as a "usage" event, and summed by stats; live sandboxes are asked now."""
    busy = (await api.call("POST", "/sandbox", json={"runtime": "python:3.13"}, expect=201))["data"]["sandboxId"]
    code, _ = await run(api, busy, "python3", "-c", "import time\nt=time.process_time()\nwhile time.process_time()-t<0.4: pass\n"
                                                   "b=bytearray(64*2**20)")
    assert code == 0
    live = await api.data("GET", "/sandbox/stats")
    assert live["cpu"]["seconds"] >= 0.35, live
    await api.call("DELETE", f"/sandbox/{busy}")
    stats = await api.data("GET", "/sandbox/stats")
    assert stats["cpu"]["byStatus"]["deleted"] >= 0.35, stats
    assert stats["memory"]["gibSeconds"] > 0, stats
