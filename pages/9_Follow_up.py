"""Follow-up: wounds across visits — link a visit's wounds to their tracks, area curves, the photos of a
track side by side, and the tidy CSV for statistics (annotations.followup)."""
from __future__ import annotations

from app import auth, follow_up, navigation

ws = navigation.page("Follow-up", need="view")
follow_up.main(ws, auth.allowed("annotate"))
