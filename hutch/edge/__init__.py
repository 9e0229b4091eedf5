"""What both of hutch's HTTP servers — the API and the node agent — do at their edge alike.

Below both in the layers (pyproject.toml), since the agent may not import the API."""
