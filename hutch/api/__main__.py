"""``python -m hutch.api``: serve with configuration from HUTCH_* variables (used by tests;
users run ``hutch serve``). A refusal at start (a busy data dir, a store bound to another
event log) ends the process with its message and code, not a traceback."""

import sys

from hutch.api.app import run_server
from hutch.core.errors import HutchError
from hutch.service.config import Config
from hutch.service.extras import missing_message

try:
    config = Config.from_env()
    if (missing := missing_message(config)) is not None:
        print(f"hutch: error: {missing}", file=sys.stderr, flush=True)
        sys.exit(2)
    run_server(config)
except HutchError as err:
    print(f"hutch: error: {err.message} [{err.code}]", file=sys.stderr, flush=True)
    sys.exit(1)
