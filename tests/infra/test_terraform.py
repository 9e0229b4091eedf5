"""infra/terraform, checked with the real OpenTofu (./scripts/tofu) and Debian's cloud-init.

What CI checks: `tofu fmt -check -recursive`; `tofu init -backend=false` + `tofu validate` on the
root and on each module by itself; the nomad-node module's user data, rendered by a real
`tofu apply` for a server and a client, passes `cloud-init schema`. Each init runs in a temporary
copy, so the repository never gets a .terraform/ or a lock file. The negative tests show each
check can fail. Nothing skips: without tofu's build (Go, the vendored provider) or cloud-init
the tests fail.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TOFU = REPO / "scripts" / "tofu"
TERRAFORM = REPO / "infra" / "terraform"
MODULES = ["modules/nomad-node", "modules/hutch-on-nomad"]

# scripts/install --dev builds tofu and the provider; a machine that skipped it builds them in the
# first test (~3.5 min on 2 cores), hence the timeout. Each command below has its own, shorter one.
pytestmark = pytest.mark.timeout(600)


def run(
    *args: str | Path, cwd: Path, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        pytest.fail(
            f"{' '.join(map(str, args))} (in {cwd}) exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def tofu(
    command: str, *args: str, cwd: Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    flags = ["-no-color"] if command in ("init", "validate", "apply") else []
    return run(TOFU, command, *flags, *args, cwd=cwd, check=check)


@pytest.fixture(scope="module")
def tofu_built() -> Path:
    """Builds (once, cached) or finds OpenTofu and the Nomad provider; fails if it cannot."""
    proc = run(TOFU, "build", cwd=REPO, timeout=900)
    binary = Path(proc.stdout.strip().splitlines()[-1])
    assert binary.is_file(), f"scripts/tofu build printed {binary!r}, not a file\n{proc.stderr}"
    version = run(TOFU, "version", cwd=REPO).stdout
    assert version.startswith("OpenTofu v1.10.6\n"), version
    return binary


@pytest.fixture(scope="module")
def cloud_init() -> str:
    path = shutil.which("cloud-init")
    if path is None:
        pytest.fail(
            "cloud-init is not installed (Debian package cloud-init; ./scripts/install --dev)"
        )
    return path


def copy_tree(dest: Path) -> Path:
    """infra/terraform without anyone's local init state."""
    shutil.copytree(
        TERRAFORM,
        dest,
        ignore=shutil.ignore_patterns(".terraform", ".terraform.lock.hcl", "*.tfstate*"),
    )
    return dest


@pytest.fixture(scope="module")
def rendered(
    tofu_built: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, str]]:
    """The nomad-node module's outputs for a server and a client, by a real `tofu apply`."""
    tree = copy_tree(tmp_path_factory.mktemp("render") / "terraform")
    root = tree / "render-check"
    root.mkdir()
    blocks = []
    for role in ("server", "client"):
        blocks.append(f'''
module "{role}" {{
  source            = "../modules/nomad-node"
  role              = "{role}"
  datacenter        = "dc1"
  server_ips        = ["10.0.0.10", "10.0.0.11", "10.0.0.12"]
  artifact_base_url = "https://artifacts.example.internal/hutch/"
}}

output "{role}_user_data" {{
  value = module.{role}.user_data
}}

output "{role}_agent_hcl" {{
  value = module.{role}.agent_hcl
}}
''')
    (root / "main.tf").write_text("".join(blocks))
    tofu("init", "-backend=false", "-input=false", cwd=root)
    tofu("apply", "-auto-approve", "-input=false", cwd=root)
    return {
        role: {
            "user_data": tofu("output", "-raw", f"{role}_user_data", cwd=root).stdout,
            "agent_hcl": tofu("output", "-raw", f"{role}_agent_hcl", cwd=root).stdout,
        }
        for role in ("server", "client")
    }


def test_fmt_check_recursive(tofu_built: Path) -> None:
    proc = tofu("fmt", "-check", "-recursive", "-diff", cwd=TERRAFORM, check=False)
    assert proc.returncode == 0, (
        f"tofu fmt -check -recursive: files to format:\n{proc.stdout}{proc.stderr}"
    )


def test_fmt_check_finds_misformatted_code(tofu_built: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.tf").write_text('locals {\n  a = 1\n  long_name = "x"\n}\n')
    proc = tofu("fmt", "-check", "-recursive", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "bad.tf" in proc.stdout, proc


@pytest.mark.parametrize("where", [".", *MODULES])
def test_init_and_validate(tofu_built: Path, tmp_path: Path, where: str) -> None:
    directory = copy_tree(tmp_path / "terraform") / where
    tofu("init", "-backend=false", "-input=false", cwd=directory)
    proc = tofu("validate", cwd=directory)
    assert "Success! The configuration is valid." in proc.stdout, proc.stdout
    assert not (TERRAFORM / where / ".terraform").exists(), "init ran in the repository"


def test_validate_names_a_broken_reference(tofu_built: Path, tmp_path: Path) -> None:
    directory = copy_tree(tmp_path / "terraform") / "modules" / "nomad-node"
    with (directory / "main.tf").open("a") as f:
        f.write('\noutput "broken" {\n  value = var.no_such_setting\n}\n')
    tofu("init", "-backend=false", "-input=false", cwd=directory)
    proc = tofu("validate", cwd=directory, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "no_such_setting" in proc.stderr and "undeclared input variable" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.parametrize("role", ["server", "client"])
def test_rendered_user_data_passes_cloud_init_schema(
    rendered: dict[str, dict[str, str]], cloud_init: str, tmp_path: Path, role: str
) -> None:
    user_data, agent_hcl = rendered[role]["user_data"], rendered[role]["agent_hcl"]
    path = tmp_path / f"{role}.yaml"
    path.write_text(user_data)
    proc = run(cloud_init, "schema", "--config-file", path, cwd=tmp_path, check=False)
    assert proc.returncode == 0, (
        f"cloud-init schema rejects the {role}'s user data:\n{proc.stdout}{proc.stderr}\n{user_data}"
    )
    assert "Valid cloud-config" in proc.stdout, proc.stdout

    # What the node gets: the agent configuration verbatim, the right packages and binaries.
    assert user_data.startswith("#cloud-config\n")
    doc = yaml.safe_load(user_data)
    files = {f["path"]: f for f in doc["write_files"]}
    assert files["/etc/nomad.d/agent.hcl"]["content"].rstrip("\n") == agent_hcl.rstrip("\n")
    assert (
        "ExecStart=/usr/local/bin/nomad agent -config /etc/nomad.d"
        in files["/etc/systemd/system/nomad.service"]["content"]
    )
    commands = "\n".join(doc["runcmd"])
    assert "https://artifacts.example.internal/hutch/nomad-v1.10.0" in commands
    assert "systemctl enable --now nomad" in commands
    if role == "server":
        assert "bootstrap_expect = 3" in agent_hcl and "client {" not in agent_hcl
        assert "containerd" not in doc["packages"] and "hutch-containerd" not in commands
    else:
        assert '"10.0.0.10:4647"' in agent_hcl and 'plugin "hutch-containerd"' in agent_hcl
        # The node agents' driver, on by default: confined to hutch-system by the namespaces
        # hutch-on-nomad sets (tests/adversarial/test_node_namespace.py tries the way around).
        assert 'plugin "raw_exec" {\n  config {\n    enabled = true' in agent_hcl
        denylist = next(line for line in agent_hcl.splitlines() if '"driver.denylist"' in line)
        assert "raw_exec" not in denylist, denylist
        assert {"containerd", "runc", "containernetworking-plugins"} <= set(doc["packages"])
        # One list for both kinds of client: this module's and those `services start cluster` runs.
        listed = (TERRAFORM / "modules" / "nomad-node" / "client-packages.txt").read_text().split("\n")
        assert doc["packages"] == [p.strip() for p in listed if p.strip() and not p.startswith("#")]
        nomad_sh = (REPO / "scripts" / "services.d" / "nomad.sh").read_text()
        assert "infra/terraform/modules/nomad-node/client-packages.txt" in nomad_sh
        cluster_sh = (REPO / "scripts" / "services.d" / "cluster.sh").read_text()
        assert "infra/terraform/modules/nomad-node/agent.hcl.tftpl" in cluster_sh
        assert "https://artifacts.example.internal/hutch/hutch-containerd" in commands


def test_cloud_init_schema_rejects_a_broken_document(
    rendered: dict[str, dict[str, str]], cloud_init: str, tmp_path: Path
) -> None:
    # A value of the wrong type, as a template edit might leave it.
    broken = rendered["client"]["user_data"].replace(
        "package_update: true", "package_update: always", 1
    )
    assert broken != rendered["client"]["user_data"]
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    proc = run(cloud_init, "schema", "--config-file", path, cwd=tmp_path, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "package_update" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
