"""The HTML summary a Trial shows in notebooks: it lives with the trial (tensortap.trials.summary), so that
nothing in trials/ imports the ui; named here too for the dashboard's callers."""

from __future__ import annotations

from tensortap.trials.summary import trial_html

__all__ = ["trial_html"]
