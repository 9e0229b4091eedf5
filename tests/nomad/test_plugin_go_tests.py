"""The containerd plugin's own Go tests, all of them in one `go test` (one build): the egress
chain's order and rules of the moment after a restart (egress_test.go), the pids guard sparing
a command the exec agent runs and not an ended one's leftovers, nor anything through a recycled
pid (pidsguard_test.go), cgroup usage on v1 and v2 (handle_test.go), a connect into the
sandbox's namespace (connect_test.go). Every test function the files declare must have run and
passed: a filter or a build tag that left one out would not pass silently."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "scripts/services.d/nomad/containerd-driver"


def test_every_go_test_of_the_plugin_runs_and_passes() -> None:
    go = shutil.which("go") or "/usr/local/go/bin/go"
    assert Path(go).is_file(), "Go is not installed: the plugin cannot be built or tested"
    declared = {m.group(1) for f in MODULE.glob("*_test.go")
                for m in re.finditer(r"^func (Test\w+)\(t \*testing\.T\)", f.read_text(), re.M)}
    assert len(declared) >= 11, declared
    done = subprocess.run([go, "test", "-count=1", "-v", "."], cwd=MODULE, capture_output=True, text=True,
                          env={**os.environ, "GOFLAGS": "-mod=mod"}, timeout=600, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    passed = set(re.findall(r"^--- PASS: (Test\w+)", done.stdout, re.M))
    assert declared <= passed, f"declared but not passed: {sorted(declared - passed)}\n{done.stdout}"
