"""See the training: the live dashboard (`tensortap ui`), the offline HTML report (`tensortap report`)
and the HTML summary a Trial shows in notebooks. The dashboard needs flask and `tensortap.plot` plotly
(tensortap[ui]); the report needs neither (plotly.js is vendored in static/). Importing this package imports
neither: each command imports what it uses.
"""

from __future__ import annotations

__all__ = ["serve", "write_report", "trial_html"]


def serve(paths: list[str], host: str = "127.0.0.1", port: int = 6007) -> int:
    """Serve the dashboard for the jobs at `paths` until interrupted (see tensortap.ui.server)."""
    from tensortap.ui.server import serve as _serve

    return _serve(paths, host, port)


def write_report(paths: list[str], output: str) -> int:
    """Write the self-contained HTML report of the jobs at `paths` to `output`; returns its size."""
    from tensortap.ui.report import write_report as _write

    return _write(paths, output)


def trial_html(trial: object) -> str:
    """A short HTML summary of a trial (for Jupyter's rich display)."""
    from tensortap.ui.summary import trial_html as _html

    return _html(trial)
