"""Tenancy: organizations, their projects, API keys with roles, and quotas — pure.

Organizations, projects and keys are events in the log like sandboxes (so every API replica
folds the same directory and knows a revocation as soon as it has read the event). Their
stream is the organization's id: one organization's records are ordered among themselves.

An organization's id is ``org_`` + its name (names are unique slugs), so the wire's
``{"id": …, "name": …}`` and the ``@org/name:tag`` snapshot names need no lookup. The
organization every server has from its first start is ``org_local``: data from before
tenancy (no ``org_id`` anywhere) belongs to it, which is the whole upgrade.

A key's secret is shown once, at creation; the log and the stores keep its SHA-256 only.
Secrets are 256 random bits, so a fast hash is enough (nothing to brute-force), and the
lookup on every request is one dictionary hit.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from contextvars import ContextVar
from enum import StrEnum
from typing import ClassVar

import attrs

from hutch.core import ids
from hutch.core.errors import Forbidden, InvalidInput, NotFound
from hutch.core.limits import PUBLIC_KEY_CHARS

LOCAL_ORG = "org_local"
SECRET_PREFIX = "hk_"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")
# A key's rate (requests a second) and burst, as a token bucket can hold them: below RATE_MIN
# the wait for a token was a Retry-After of hundreds of digits, or infinite (a 500 at every
# request); a burst is whole requests.
RATE_MIN, RATE_MAX, BURST_MAX = 0.001, 1_000_000.0, 1_000_000


class Role(StrEnum):
    ADMIN = "admin"  # keys, quotas, projects and everything a member may do
    MEMBER = "member"  # sandboxes and snapshots
    READ_ONLY = "read-only"  # lists, gets, events, output


class Access(StrEnum):
    """What a route needs. ``server``: the server's administrator only (the bootstrap key)."""

    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    SERVER = "server"


GRANTS: dict[Role, frozenset[Access]] = {
    Role.ADMIN: frozenset({Access.READ, Access.WRITE, Access.ADMIN}),
    Role.MEMBER: frozenset({Access.READ, Access.WRITE}),
    Role.READ_ONLY: frozenset({Access.READ}),
}


@attrs.frozen
class QuotaRecord:
    """Limits of one organization; None = unlimited. Memory and CPU count live sandboxes'
    requested resources (what they may use, not what they happen to use now)."""

    sandboxes: int | None = None  # concurrent, not final
    memory_bytes: int | None = None
    cpu_millis: int | None = None
    snapshot_bytes: int | None = None  # ready snapshots' archives

    FIELDS: ClassVar[tuple[str, ...]] = ("sandboxes", "memory_bytes", "cpu_millis", "snapshot_bytes")


@attrs.frozen
class OrganizationRecord:
    org_id: str
    name: str
    created_at: str
    quota: QuotaRecord = QuotaRecord()


@attrs.frozen
class ProjectRecord:
    project_id: str
    org_id: str
    name: str
    created_at: str


@attrs.frozen
class ApiKeyRecord:
    key_id: str
    org_id: str
    role: Role
    name: str
    secret_hash: str  # sha256 hex of the secret
    prefix: str  # the secret's first characters, so a person can tell keys apart
    created_at: str
    projects: tuple[str, ...] = ()  # () = every project of the org
    expires_at: str | None = None
    revoked_at: str | None = None
    rate: float | None = None  # requests per second (None: the server's default)
    burst: int | None = None


@attrs.frozen
class SshKeyRecord:
    """A public key that opens the SSH gateway (api/ssh_gateway.py) to the organization's
    sandboxes, with the rights of a member limited to ``projects`` (those of the API key
    that added it). It lives as long as that API key: revoked or expired, its SSH keys open
    nothing (off-boarding ends every access a key gave). The same public key may be in
    several organizations: the sandbox named in the SSH user name says which one is meant."""

    ssh_key_id: str
    org_id: str
    name: str
    public_key: str  # OpenSSH's one-line form: "ssh-ed25519 AAAA… [comment]"
    fingerprint: str  # SHA256:…, as ssh-keygen -l shows it
    created_at: str
    added_by: str | None = None  # the API key id that added it
    projects: tuple[str, ...] = ()
    removed_at: str | None = None


# ---------------------------------------------------------------- events (stream: the org id)


@attrs.frozen
class OrgCreated:
    type: ClassVar[str] = "org:created"
    name: str


@attrs.frozen
class QuotaSet:
    type: ClassVar[str] = "org:quota"
    quota: QuotaRecord


@attrs.frozen
class ProjectCreated:
    type: ClassVar[str] = "project:created"
    project_id: str
    name: str


@attrs.frozen
class KeyCreated:
    type: ClassVar[str] = "key:created"
    key_id: str
    role: Role
    name: str
    secret_hash: str
    prefix: str
    projects: tuple[str, ...] = ()
    expires_at: str | None = None
    rate: float | None = None
    burst: int | None = None


@attrs.frozen
class KeyRevoked:
    type: ClassVar[str] = "key:revoked"
    key_id: str


@attrs.frozen
class SshKeyAdded:
    type: ClassVar[str] = "sshkey:added"
    ssh_key_id: str
    name: str
    public_key: str
    fingerprint: str
    added_by: str | None = None
    projects: tuple[str, ...] = ()


@attrs.frozen
class SshKeyRemoved:
    type: ClassVar[str] = "sshkey:removed"
    ssh_key_id: str


TENANCY_EVENTS: tuple[type, ...] = (OrgCreated, QuotaSet, ProjectCreated, KeyCreated, KeyRevoked,
                                    SshKeyAdded, SshKeyRemoved)
Record = OrganizationRecord | ProjectRecord | ApiKeyRecord | SshKeyRecord


# ---------------------------------------------------------------- the directory's fold


@attrs.define
class Directory:
    """Organizations, projects and keys as of ``position``: a plain fold, kept in memory by
    every API process (and by the memory store). ``apply`` returns what changed."""

    orgs: dict[str, OrganizationRecord] = attrs.field(factory=dict)
    projects: dict[str, ProjectRecord] = attrs.field(factory=dict)
    keys: dict[str, ApiKeyRecord] = attrs.field(factory=dict)
    by_hash: dict[str, str] = attrs.field(factory=dict)  # secret hash -> key id
    position: int = 0
    ssh_keys: dict[str, SshKeyRecord] = attrs.field(factory=dict)
    by_fingerprint: dict[str, tuple[str, ...]] = attrs.field(factory=dict)  # fingerprint -> ssh key ids not removed

    def __attrs_post_init__(self) -> None:
        self.orgs.setdefault(LOCAL_ORG, OrganizationRecord(LOCAL_ORG, "local", "1970-01-01T00:00:00Z"))

    def apply(self, stream: str, at: str, data: object) -> list[Record]:
        changed: list[Record] = []
        match data:
            case OrgCreated(name=name):
                changed.append(OrganizationRecord(stream, name, at))
            case QuotaSet(quota=quota) if stream in self.orgs:
                changed.append(attrs.evolve(self.orgs[stream], quota=quota))
            case ProjectCreated(project_id=pid, name=name):
                changed.append(ProjectRecord(pid, stream, name, at))
            case KeyCreated():
                changed.append(ApiKeyRecord(data.key_id, stream, data.role, data.name, data.secret_hash, data.prefix, at,
                                      data.projects, data.expires_at, None, data.rate, data.burst))
            case KeyRevoked(key_id=kid) if kid in self.keys:
                changed.append(attrs.evolve(self.keys[kid], revoked_at=at))
            case SshKeyAdded():
                changed.append(SshKeyRecord(data.ssh_key_id, stream, data.name, data.public_key, data.fingerprint, at,
                                      data.added_by, data.projects))
            case SshKeyRemoved(ssh_key_id=sid) if sid in self.ssh_keys:
                changed.append(attrs.evolve(self.ssh_keys[sid], removed_at=at))
        for record in changed:
            self.put(record)
        return changed

    def put(self, record: Record) -> None:
        if isinstance(record, OrganizationRecord):
            self.orgs[record.org_id] = record
        elif isinstance(record, ProjectRecord):
            self.projects[record.project_id] = record
        elif isinstance(record, SshKeyRecord):
            self.ssh_keys[record.ssh_key_id] = record
            others = tuple(i for i in self.by_fingerprint.get(record.fingerprint, ()) if i != record.ssh_key_id)
            ids_ = (*others, record.ssh_key_id) if record.removed_at is None else others
            if ids_:
                self.by_fingerprint[record.fingerprint] = ids_
            else:
                self.by_fingerprint.pop(record.fingerprint, None)
        else:
            self.keys[record.key_id] = record
            self.by_hash[record.secret_hash] = record.key_id

    def copy(self) -> Directory:
        return Directory(dict(self.orgs), dict(self.projects), dict(self.keys), dict(self.by_hash), self.position,
                         dict(self.ssh_keys), dict(self.by_fingerprint))

    def key_for(self, secret: str) -> ApiKeyRecord | None:
        key_id = self.by_hash.get(hash_secret(secret))
        return self.keys.get(key_id) if key_id else None

    def ssh_keys_for(self, fingerprint: str, now: str) -> list[SshKeyRecord]:
        """The live SSH keys with this fingerprint (one per organization or projects that
        registered it), oldest first."""
        found = (self.ssh_keys[i] for i in self.by_fingerprint.get(fingerprint, ()))
        return sorted((k for k in found if self.ssh_key_live(k, now)), key=lambda k: k.created_at)

    def ssh_key_live(self, record: SshKeyRecord, now: str) -> bool:
        """Not removed, and the API key that added it neither revoked nor expired at ``now``
        (the bootstrap key, which is in no directory, never is)."""
        if record.removed_at is not None:
            return False
        adder = self.keys.get(record.added_by) if record.added_by else None
        return adder is None or key_live(adder, now)

    def org_projects(self, org_id: str) -> list[ProjectRecord]:
        return sorted((p for p in self.projects.values() if p.org_id == org_id), key=lambda p: p.created_at)


def key_live(key: ApiKeyRecord, now: str) -> bool:
    """Neither revoked nor expired at ``now`` (ISO-8601 UTC, as the records hold times)."""
    return key.revoked_at is None and (key.expires_at is None or key.expires_at > now)


def _raw(text: str) -> bytes:
    # What the client sent, byte for byte: aiohttp hands header bytes that are not UTF-8 over
    # as surrogates, which a plain encode() refuses (a 500 for any such header before).
    return text.encode("utf-8", "surrogateescape")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(_raw(secret)).hexdigest()


def secrets_match(given: str, wanted: str) -> bool:
    """Constant-time equality of a secret a client sent (a key, a token, a MAC: any bytes,
    any characters) with ours; never an error (``hmac.compare_digest`` refuses a str
    holding characters outside ASCII)."""
    return hmac.compare_digest(_raw(given), _raw(wanted))


def org_id_for(name: str) -> str:
    return "org_" + name


# ---------------------------------------------------------------- commands: validate, then events


# What no label a person reads needs, and what rewrites the terminal or the line it is read in:
# C0 and C1 controls (escape sequences, newlines, NUL) and the bidirectional marks, overrides
# and isolates (U+202E shows "cv\u202egpj.exe" as "cvexe.jpg").
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def check_label(value: str, field: str) -> str:
    """``value``, refused by ``field`` when it holds a character that is not shown as itself."""
    if (found := _UNSHOWABLE.search(value)) is not None:
        raise InvalidInput(f"{field}: holds U+{ord(found.group()):04X}, a control or direction character; "
                           "a name is text a person reads", field=field)
    return value


def check_name(value: object, field: str) -> str:
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidInput(f"{field}: {value!r} must be 1-63 lower-case letters, digits and -, "
                           "starting with a letter or digit", field=field)
    return value


def create_org(directory: Directory, name: object) -> tuple[str, OrgCreated]:
    name = check_name(name, "name")
    org_id = org_id_for(name)
    if org_id in directory.orgs:
        raise InvalidInput(f"name: an organization named {name!r} exists already", field="name")
    return org_id, OrgCreated(name=name)


def create_project(directory: Directory, org_id: str, name: object) -> ProjectCreated:
    name = check_name(name, "name")
    if any(p.name == name for p in directory.org_projects(org_id)):
        raise InvalidInput(f"name: organization {org_id} has a project named {name!r} already", field="name")
    return ProjectCreated(project_id=ids.new_id("project"), name=name)


def within(limit: tuple[str, ...], projects: tuple[str, ...]) -> bool:
    """Whether a key limited to ``limit`` (() = every project) may administer a key (API or
    SSH) limited to ``projects``: one limited to projects only keys limited to some of its
    own, never an organization-wide one (that would be a way out of its projects)."""
    return not limit or (bool(projects) and set(projects) <= set(limit))


def create_key(directory: Directory, org_id: str, *, role: object, name: object = None,
               projects: object = (), expires_at: object = None, rate: object = None,
               burst: object = None, now: dt.datetime | None = None, limit: tuple[str, ...] = (),
               field: str = "projects", until: str | None = None) -> tuple[str, KeyCreated]:
    """(the secret, shown once; the event, which holds its hash only). ``limit``: the projects
    the creating key is limited to; the new key is limited to them too (to all of them when
    ``projects`` names none), and naming another is refused by ``field``. ``until``: when the
    creating key expires; the new key expires then too when it names no expiry, and naming a
    later one is refused (a key for a day must not make one for ever: a way past its end)."""
    if not isinstance(role, str) or role not in {r.value for r in Role}:
        raise InvalidInput(f"role: {role!r} is not a role; expected admin, member or read-only", field="role")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 100):
        raise InvalidInput("name: expected a string of 1-100 characters", field="name")
    if isinstance(name, str):
        check_label(name, "name")
    if not isinstance(projects, (list, tuple)) or not all(isinstance(p, str) for p in projects):
        raise InvalidInput("projects: expected a list of project ids or names", field="projects")
    # Each once (by name or id): a list repeating one was kept whole, in the log for ever.
    project_ids = tuple(dict.fromkeys(resolve_project(directory, org_id, p, field) for p in dict.fromkeys(projects)))
    if limit and not project_ids:
        project_ids = limit
    if not within(limit, project_ids):
        raise InvalidInput(f"{field}: this key may only make keys in projects {', '.join(limit)}", field=field)
    expires = check_expiry(expires_at, now or dt.datetime.now(dt.UTC)) if expires_at is not None else until
    if until is not None and expires is not None and expires > until:  # both "%Y-%m-%dT%H:%M:%SZ"
        raise InvalidInput(f"expires: {expires_at!r} is past {until}, when this key expires; the keys it makes "
                           "expire no later", field="expires")
    numbers: dict[str, float | None] = {}
    for field, value, low, high in (("rate", rate, RATE_MIN, RATE_MAX), ("burst", burst, 1, BURST_MAX)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
            raise InvalidInput(f"{field}: expected a positive number, got {value!r}", field=field)
        if value is not None and not (low <= value <= high and (field == "rate" or float(value).is_integer())):
            kind = "requests a second" if field == "rate" else "a whole number of requests"
            raise InvalidInput(f"{field}: expected {kind} from {low:g} to {high:g}, got {value!r}", field=field)
        numbers[field] = value
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    key_id = ids.new_id("key")
    rate_, burst_ = numbers["rate"], numbers["burst"]
    return secret, KeyCreated(key_id=key_id, role=Role(role), name=name or key_id, secret_hash=hash_secret(secret),
                              prefix=secret[:10], projects=project_ids, expires_at=expires,
                              rate=float(rate_) if rate_ is not None else None,
                              burst=int(burst_) if burst_ is not None else None)


def resolve_project(directory: Directory, org_id: str, ref: str, field: str = "projectId") -> str:
    """A project of ``org_id`` by id or name; another org's project is as unknown as none."""
    for p in directory.org_projects(org_id):
        if ref in (p.project_id, p.name):
            return p.project_id
    raise InvalidInput(f"{field}: organization {org_id} has no project {ref!r}", field=field)


_DURATION_RE = re.compile(r"^(\d+)([smhdw])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def check_expiry(value: object, now: dt.datetime) -> str:
    """``30d``/``12h``/… from now, or an ISO-8601 time in the future; an ISO string back."""
    if isinstance(value, str) and (m := _DURATION_RE.match(value.strip())):
        try:
            moment = now + dt.timedelta(seconds=int(m.group(1)) * _UNIT_SECONDS[m.group(2)])
        except OverflowError:
            raise InvalidInput(f"expires: {value!r} is past the year 9999", field="expires") from None
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInput(f"expires: {value!r} is neither a duration (30d, 12h, 90m) nor an ISO-8601 time",
                               field="expires") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
    if moment <= now:
        raise InvalidInput(f"expires: {value!r} is not in the future", field="expires")
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def revoke_key(directory: Directory, org_id: str | None, key_id: str,
               limit: tuple[str, ...] = ()) -> list[KeyRevoked | SshKeyRemoved]:
    """The key's revocation and the removal of every SSH key it added: off-boarding a person
    ends their SSH access too, and the organization's list says so. A key outside ``limit``
    (the revoking key's projects: ``within``) is as unknown as one that never was."""
    key = directory.keys.get(key_id)
    if key is None or (org_id is not None and key.org_id != org_id) or not within(limit, key.projects):
        raise NotFound(f"key {key_id} not found")
    if key.revoked_at is not None:
        raise InvalidInput(f"key {key_id} is revoked already", field="keyId")
    added = sorted((k for k in directory.ssh_keys.values() if k.added_by == key_id and k.removed_at is None),
                   key=lambda k: k.created_at)
    return [KeyRevoked(key_id=key_id), *(SshKeyRemoved(ssh_key_id=k.ssh_key_id) for k in added)]


# What the SSH gateway takes (what OpenSSH 9 makes by default, and the hardware-backed kinds).
SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                 "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def ssh_fingerprint(public_key: object) -> tuple[str, str]:
    """(the key's one line, as kept; its SHA256 fingerprint as ``ssh-keygen -l`` shows it) of
    an OpenSSH public key line, checked: a private key, another format or a damaged key is
    refused by name."""
    if not isinstance(public_key, str) or not public_key.strip():
        raise InvalidInput("publicKey: required, one line as in ~/.ssh/id_ed25519.pub", field="publicKey")
    if len(public_key) > PUBLIC_KEY_CHARS:
        raise InvalidInput(f"publicKey: {len(public_key)} characters; an OpenSSH public key line is at most "
                           f"{PUBLIC_KEY_CHARS}", field="publicKey")
    line = public_key.strip()
    if "PRIVATE KEY" in line:
        raise InvalidInput("publicKey: this is a private key; send the .pub file's line, and keep this one secret",
                           field="publicKey")
    parts = line.split()
    if len(parts) < 2 or "\n" in line or parts[0] not in SSH_KEY_TYPES:
        raise InvalidInput(f"publicKey: expected 'TYPE BASE64 [comment]' with TYPE one of {', '.join(SSH_KEY_TYPES)}",
                           field="publicKey")
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except ValueError:
        raise InvalidInput("publicKey: its key data is not valid base64", field="publicKey") from None
    # The blob starts with its own type, length-prefixed: a pasted-together line fails here.
    n = int.from_bytes(blob[:4], "big") if len(blob) >= 4 else -1
    if n < 0 or blob[4:4 + n].decode(errors="replace") != parts[0]:
        raise InvalidInput(f"publicKey: the key data is not a {parts[0]} key", field="publicKey")
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return " ".join(parts[:3]), "SHA256:" + digest


def add_ssh_key(directory: Directory, org_id: str, public_key: object, name: object, *, added_by: str | None,
                projects: tuple[str, ...] = (), now: str) -> SshKeyAdded:
    line, fingerprint = ssh_fingerprint(public_key)
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 200):
        raise InvalidInput("name: a label of 1 to 200 characters", field="name")
    if isinstance(name, str):
        check_label(name, "name")
    check_label(line, "publicKey")  # its comment is the label when no name is given
    # Other organizations' registrations are not looked at: one registering a person's public
    # key first must not lock her out of her own, nor learn that she has one anywhere. The
    # login's sandbox id says which organization's registration applies.
    for known in directory.ssh_keys_for(fingerprint, now):
        if known.org_id == org_id and known.projects == projects:
            raise InvalidInput(f"publicKey: key {fingerprint} is registered already in this organization "
                               f"({known.ssh_key_id})", field="publicKey")
    label = name if isinstance(name, str) else (line.split(" ", 2)[2] if line.count(" ") >= 2 else fingerprint)
    return SshKeyAdded(ssh_key_id=ids.new_id("ssh_key"), name=label, public_key=line, fingerprint=fingerprint,
                       added_by=added_by, projects=projects)


def remove_ssh_key(directory: Directory, org_id: str | None, ssh_key_id: str,
                   limit: tuple[str, ...] = ()) -> SshKeyRemoved:
    key = directory.ssh_keys.get(ssh_key_id)
    if key is None or key.removed_at is not None or (org_id is not None and key.org_id != org_id) \
            or not within(limit, key.projects):
        raise NotFound(f"ssh key {ssh_key_id} not found")
    return SshKeyRemoved(ssh_key_id=ssh_key_id)


def set_quota(values: Mapping[str, object], current: QuotaRecord) -> QuotaSet:
    """Fields given replace the current ones; ``None`` lifts a limit."""
    changes: dict[str, int | None] = {}
    for field, value in values.items():
        if field not in QuotaRecord.FIELDS:
            raise InvalidInput(f"{field}: not a quota; expected one of {', '.join(QuotaRecord.FIELDS)}", field=field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise InvalidInput(f"{field}: expected a whole number >= 0 or null, got {value!r}", field=field)
        changes[field] = value
    return QuotaSet(quota=attrs.evolve(current, **changes))


# ---------------------------------------------------------------- who is asking


@attrs.frozen
class Principal:
    """What a request's key may do: act for ``org_id`` (the server administrator for any
    organization, chosen by ``orgId``) in ``projects`` (() = all) with ``role``."""

    key_id: str
    org_id: str
    role: Role
    projects: tuple[str, ...] = ()
    server_admin: bool = False

    def may(self, access: Access) -> bool:
        return self.server_admin if access is Access.SERVER else access in GRANTS[self.role]

    def require(self, access: Access) -> None:
        if access is Access.SERVER:
            if not self.server_admin:
                raise Forbidden("only the server's administrator (its bootstrap key) may do this")
        elif access not in GRANTS[self.role]:
            need = {Access.WRITE: "member or admin", Access.ADMIN: "admin"}.get(access, "any")
            raise Forbidden(f"this key's role is {self.role.value}; this needs a {need} key")

    def acting_for(self, requested: str | None, directory: Directory) -> Principal:
        """The principal for the ``orgId`` a request names (None: the key's own)."""
        if requested is None or requested == self.org_id:
            return self
        if self.server_admin and requested in directory.orgs:
            return attrs.evolve(self, org_id=requested)
        # Same words whether or not it exists: a key learns nothing about other organizations.
        raise Forbidden(f"orgId: this key may not act for organization {requested!r} "
                        f"(it acts for {self.org_id})", field="orgId")


@attrs.frozen
class Scope:
    """What the request being served may see. Set per request by the API (``SCOPE``);
    None outside requests (the server's own work: recovery, timeouts) sees everything."""

    org_id: str
    projects: tuple[str, ...] = ()

    def sees(self, org_id: str, project_id: str | None = None) -> bool:
        if org_id != self.org_id:
            return False
        return not self.projects or project_id in self.projects


SCOPE: ContextVar[Scope | None] = ContextVar("hutch_scope", default=None)


def visible(org_id: str, project_id: str | None = None) -> bool:
    """Whether the request being served may see an item of ``org_id`` (and ``project_id``)."""
    scope = SCOPE.get()
    return scope is None or scope.sees(org_id, project_id)


def visible_org(org_id: str) -> bool:
    """Organization-wide items (stdin streams): any key of the organization sees them."""
    scope = SCOPE.get()
    return scope is None or scope.org_id == org_id


def scoped_org() -> str | None:
    scope = SCOPE.get()
    return scope.org_id if scope else None
