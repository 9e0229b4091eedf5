"""The aiohttp application: wire-compatible routes, auth, and the service layer."""
