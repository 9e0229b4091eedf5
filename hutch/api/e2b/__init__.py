"""E2B's wire (its SDK's control plane and envd) on hutch: api/e2b/server.py."""
