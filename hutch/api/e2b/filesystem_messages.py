"""envd's filesystem messages (e2b-dev/E2B spec/envd/filesystem/filesystem.proto), as schemas
for api/e2b/codec.py: field name -> (number, kind, what)."""

from __future__ import annotations

from hutch.api.e2b.codec import Schema

FILE_TYPES = {"FILE_TYPE_UNSPECIFIED": 0, "FILE_TYPE_FILE": 1, "FILE_TYPE_DIRECTORY": 2, "FILE_TYPE_SYMLINK": 3}
FILE, DIRECTORY, SYMLINK = 1, 2, 3

ENTRY_INFO: Schema = {
    "name": (1, "string", None), "type": (2, "enum", FILE_TYPES), "path": (3, "string", None),
    "size": (4, "int64", None), "mode": (5, "uint32", None), "permissions": (6, "string", None),
    "owner": (7, "string", None), "group": (8, "string", None), "modified_time": (9, "timestamp", None),
    "symlink_target": (10, "string", None), "metadata": (11, "map", None),
}
PATH_REQUEST: Schema = {"path": (1, "string", None)}  # StatRequest, MakeDirRequest, RemoveRequest
ENTRY_RESPONSE: Schema = {"entry": (1, "message", ENTRY_INFO)}  # Stat, MakeDir and Move's answers
MOVE_REQUEST: Schema = {"source": (1, "string", None), "destination": (2, "string", None)}
LIST_DIR_REQUEST: Schema = {"path": (1, "string", None), "depth": (2, "uint32", None)}
LIST_DIR_RESPONSE: Schema = {"entries": (1, "repeated", ENTRY_INFO)}
EMPTY: Schema = {}
EVENT_TYPES = {"EVENT_TYPE_UNSPECIFIED": 0, "EVENT_TYPE_CREATE": 1, "EVENT_TYPE_WRITE": 2, "EVENT_TYPE_REMOVE": 3,
               "EVENT_TYPE_RENAME": 4, "EVENT_TYPE_CHMOD": 5}
WATCH_REQUEST: Schema = {  # WatchDirRequest and CreateWatcherRequest
    "path": (1, "string", None), "recursive": (2, "bool", None), "include_entry": (3, "bool", None),
    "allow_network_mounts": (4, "bool", None),
}
FILESYSTEM_EVENT: Schema = {"name": (1, "string", None), "type": (2, "enum", EVENT_TYPES),
                            "entry": (3, "message", ENTRY_INFO)}
WATCH_DIR_RESPONSE: Schema = {"start": (1, "message", {}), "filesystem": (2, "message", FILESYSTEM_EVENT),
                              "keepalive": (3, "message", {})}
WATCHER_ID: Schema = {"watcher_id": (1, "string", None)}  # CreateWatcher's answer, Get/RemoveWatcher's ask
WATCHER_EVENTS: Schema = {"events": (1, "repeated", FILESYSTEM_EVENT)}
