"""One vocabulary for the wire: the shapes live in core/wire.py, the SDK's ``hutch.models`` and
``hutch.tenancy`` hand out the same classes, one converter (core/serde.py) maps every attrs class
whatever its module, and the shapes agree with the server's schemas (api/wire_schemas.py)."""

from __future__ import annotations

import typing

import attrs

import hutch.models
import hutch.tenancy
from hutch.api.wire_schemas import SCHEMAS
from hutch.core import serde, wire
from hutch.core.models import ExecutionStatus, SandboxStatus, SnapshotFile
from hutch.core.serde import to_camel

# The answer each shape reads (a schema in api/wire_schemas.py).
ANSWERS = {
    wire.Checkpoint: "Checkpoint",
    wire.CreateResult: "SandboxCreated",
    wire.ExecutionInfo: "Execution",
    wire.Job: "Job",
    wire.PauseResult: "Paused",
    wire.RuntimeList: "RuntimeList",
    wire.SandboxInfo: "Sandbox",
    wire.SandboxList: "SandboxList",
    wire.SandboxStatusInfo: "SandboxStatus",
    wire.Snapshot: "Snapshot",
    wire.UploadResult: "Unpacked",
    wire.Organization: "Org",
    wire.Project: "Project",
    wire.ApiKey: "Key",
    wire.SshKey: "SshKey",
}
# Fields the SDK requires that the server's schema leaves optional: an answer the schema allows
# without them would not parse. Known today; a new one fails below, a fixed one must leave here.
REQUIRED_BY_THE_SDK_ONLY = {
    "Project": {"createdAt"},
    "Key": {"name"},
    "SshKey": {"createdAt"},
}


def test_the_sdk_hands_out_core_wire_classes() -> None:
    for name in hutch.models.__all__:
        if name in ("converter", "from_wire", "to_wire"):
            assert getattr(hutch.models, name) is getattr(serde, name)
        elif name in ("SandboxStatus", "ExecutionStatus", "SandboxCreated"):
            continue  # the SDK's names for core.wire's, below
        else:
            assert getattr(hutch.models, name) is getattr(wire, name), name
    assert hutch.models.SandboxCreated is wire.CreateResult
    for name in ("ApiKey", "Organization", "Project", "Quota", "SshKey"):
        assert getattr(hutch.tenancy, name) is getattr(wire, name)
    assert wire.SnapshotFile is SnapshotFile  # the log's and the wire's file entry are one class


def test_status_names_are_the_domains() -> None:
    assert set(typing.get_args(wire.SandboxStatusName)) == {s.value for s in SandboxStatus}
    assert set(typing.get_args(wire.ExecutionStatusName)) == {s.value for s in ExecutionStatus}
    assert {"completed", "failed", "timeout", "cancelled"} == wire.TERMINAL_EXECUTION_STATUSES


@attrs.frozen(kw_only=True)
class _Elsewhere:
    """An attrs class outside core/wire.py: camelCased all the same (no list of modules)."""

    sandbox_id: str
    exit_code: int | None = None


def test_one_converter_whatever_the_module() -> None:
    assert serde.to_wire(_Elsewhere(sandbox_id="sbx_1")) == {"sandboxId": "sbx_1"}
    info = serde.from_wire(wire.SandboxStatusInfo, {"sandboxId": "sbx_1", "status": "idle", "later": 1})
    assert info == wire.SandboxStatusInfo(sandbox_id="sbx_1", status="idle")
    assert serde.to_wire(info) == {"sandboxId": "sbx_1", "status": "idle"}


def test_the_shapes_read_what_the_server_describes() -> None:
    drift = {}
    for cls, name in ANSWERS.items():
        schema = SCHEMAS[name]
        required = {to_camel(f.name) for f in attrs.fields(cls) if f.default is attrs.NOTHING}
        if extra := required - set(schema.get("required", ())):
            drift[name] = extra
    assert drift == REQUIRED_BY_THE_SDK_ONLY
