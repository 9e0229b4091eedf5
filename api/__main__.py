"""``python -m api``: serve with configuration from HUTCH_* variables (used by tests;
users run ``hutch serve``)."""

from api.app import run_server
from api.config import Config

run_server(Config.from_env())
