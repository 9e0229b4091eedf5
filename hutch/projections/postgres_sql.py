"""The SQL of the PostgreSQL projection store (``projections/postgres.py``).

Every write moves ``projection_position`` in the same statement as the rows it writes, on
the condition that the position is still the one the writer read: that is what makes a
batch apply exactly once among several projectors sharing one database.
"""

from __future__ import annotations

from typing import Any

from hutch.core.models import SandboxStatus
from hutch.projections.base import SandboxQuery

# The position and the state a batch touches, in one round trip (kind p / s / e).
LOAD = """
SELECT 'p' AS kind, NULL AS id, NULL AS sandbox_id, position AS seq, NULL::jsonb AS doc
  FROM projection_position WHERE projection = $1
UNION ALL
SELECT 's', sandbox_id, sandbox_id, 0, doc FROM sandboxes WHERE sandbox_id = ANY($3)
UNION ALL
SELECT 'e', execution_id, sandbox_id, seq, doc FROM executions
 WHERE execution_id = ANY($2) OR (sandbox_id = ANY($3) AND NOT is_final)
UNION ALL
SELECT 'n', snapshot_id, snapshot_id, 0, doc FROM snapshots WHERE snapshot_id = ANY($4)
UNION ALL
SELECT 't', id, kind, 0, doc FROM tenancy WHERE $5
"""

# Rows and position in one statement: nothing is written unless the position is still $2 and
# the store has nothing of the sandboxes $9 (those the batch creates, folded as new without a
# LOAD: projections/postgres_mirror.py; empty after a LOAD).
WRITE = """
WITH moved AS (
  UPDATE projection_position SET position = $3 WHERE projection = $1 AND position = $2
     AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE sandbox_id = ANY($9::text[]))
     AND NOT EXISTS (SELECT 1 FROM executions WHERE sandbox_id = ANY($9::text[]))
  RETURNING position
), sandbox_rows AS (
  INSERT INTO sandboxes (sandbox_id, status, is_final, name, mode, project_id, org_id, created_at, updated_at,
                         log_bytes, doc)
  SELECT r.sandbox_id, r.status, r.is_final, r.name, r.mode, r.project_id, r.org_id, r.created_at, r.updated_at,
         r.log_bytes, r.doc
    FROM jsonb_to_recordset($4::jsonb) AS r(sandbox_id text, status text, is_final boolean, name text,
         mode text, project_id text, org_id text, created_at text, updated_at text, log_bytes bigint, doc jsonb)
   WHERE EXISTS (SELECT 1 FROM moved)
  ON CONFLICT (sandbox_id) DO UPDATE SET status = EXCLUDED.status, is_final = EXCLUDED.is_final,
     name = EXCLUDED.name, mode = EXCLUDED.mode, project_id = EXCLUDED.project_id, org_id = EXCLUDED.org_id,
     created_at = EXCLUDED.created_at, updated_at = EXCLUDED.updated_at, log_bytes = EXCLUDED.log_bytes,
     doc = EXCLUDED.doc
), execution_rows AS (
  INSERT INTO executions (execution_id, sandbox_id, seq, status, is_final, doc)
  SELECT r.execution_id, r.sandbox_id, r.seq, r.status, r.is_final, r.doc
    FROM jsonb_to_recordset($5::jsonb) AS r(execution_id text, sandbox_id text, seq bigint, status text,
         is_final boolean, doc jsonb)
   WHERE EXISTS (SELECT 1 FROM moved)
  ON CONFLICT (execution_id) DO UPDATE SET status = EXCLUDED.status, is_final = EXCLUDED.is_final,
     doc = EXCLUDED.doc
), snapshot_rows AS (
  INSERT INTO snapshots (snapshot_id, status, name, tag, public, source_sandbox_id, content_hash, size_bytes,
                         file_count, org_id, created_at, doc)
  SELECT r.snapshot_id, r.status, r.name, r.tag, r.public, r.source_sandbox_id, r.content_hash, r.size_bytes,
         r.file_count, r.org_id, r.created_at, r.doc
    FROM jsonb_to_recordset($7::jsonb) AS r(snapshot_id text, status text, name text, tag text, public boolean,
         source_sandbox_id text, content_hash text, size_bytes bigint, file_count bigint, org_id text,
         created_at text, doc jsonb)
   WHERE EXISTS (SELECT 1 FROM moved)
  ON CONFLICT (snapshot_id) DO UPDATE SET status = EXCLUDED.status, name = EXCLUDED.name, tag = EXCLUDED.tag,
     public = EXCLUDED.public, size_bytes = EXCLUDED.size_bytes, file_count = EXCLUDED.file_count,
     doc = EXCLUDED.doc
), tenancy_rows AS (
  INSERT INTO tenancy (kind, id, org_id, doc)
  SELECT r.kind, r.id, r.org_id, r.doc FROM jsonb_to_recordset($8::jsonb) AS r(kind text, id text, org_id text, doc jsonb)
   WHERE EXISTS (SELECT 1 FROM moved)
  ON CONFLICT (kind, id) DO UPDATE SET doc = EXCLUDED.doc
)
SELECT pg_notify($6, position::text) IS NOT NULL FROM moved
"""

# Step over one event the store refused on its own: record it and move the position past it,
# in one statement, on the same condition as _WRITE ($2: the position read; $3: the event's).
SKIP = """
WITH moved AS (
  UPDATE projection_position SET position = $3 WHERE projection = $1 AND position = $2 RETURNING position
), recorded AS (
  INSERT INTO projection_skipped (position, event_id, sandbox_id, type, error, skipped_at)
  SELECT $3, $4, $5, $6, $7, $8::text::timestamptz WHERE EXISTS (SELECT 1 FROM moved)
  ON CONFLICT (position) DO NOTHING
)
SELECT pg_notify($9, position::text) IS NOT NULL FROM moved
"""

SKIPPED = """
SELECT position, event_id, sandbox_id, type, error,
       to_char(skipped_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS skipped_at
  FROM projection_skipped ORDER BY position LIMIT $1
"""


def where_clause(q: SandboxQuery) -> tuple[list[str], list[Any]]:
    """The filters of ``projections.base.matches``, in SQL."""
    where: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    # Never one that is only a lifecycle:discarded (SandboxState.unrecorded: no create, so no
    # creation time). It has its tenant's organization (its log bytes count against its quota),
    # but there is no sandbox to list.
    where.append("created_at <> ''")
    if q.org_id is not None:
        where.append(f"org_id = {arg(q.org_id)}")
    if q.projects:
        where.append(f"project_id = ANY({arg(list(q.projects))})")
    if q.deleted_only:
        where.append(f"status = {arg(SandboxStatus.DELETED.value)}")
    elif not q.include_deleted and q.status != "deleted":
        where.append(f"status <> {arg(SandboxStatus.DELETED.value)}")
    if q.status:
        where.append(f"status = {arg(q.status)}")
    if q.live is True:
        where.append("NOT is_final")
    elif q.live is False:
        where.append("is_final")
    if q.name:
        where.append(f"name = {arg(q.name)}")
    if q.mode:
        where.append(f"mode = {arg(q.mode)}")
    if q.project_id:
        where.append(f"project_id = {arg(q.project_id)}")
    if q.snapshot_id:
        where.append(f"doc->'spec'->>'snapshotId' = {arg(q.snapshot_id)}")
    return where, args
