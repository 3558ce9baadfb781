"""Names and patterns shared by every layer: what the upstream Conductor API allows for org and app names, and
the org that local development uses."""

from __future__ import annotations

ORG_PATTERN = r"^[a-z0-9_]+$"
APP_PATTERN = r"^[a-z0-9-_]+$"
# The org of `relay dev`'s key and the admin CLI's default.
DEFAULT_ORG = "local"
