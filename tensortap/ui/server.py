"""`tensortap ui`: the live dashboard, a small Flask app over the jobs given on the command line.

Routes: `/` the page; `/static/<file>` its script, style and plotly.js (a bundle vendored in the package,
served from here: the page fetches nothing from elsewhere); `/api/jobs`; `/api/view/<view>?job=I&...` the blocks
of a view; `/api/poll` what changed (the page polls it every second and redraws when a job moved on).
A URL names a job only by its index among the jobs given on the command line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import threading
from importlib import resources
from typing import Any

from tensortap.ui.jobs import JobSet

logger = logging.getLogger("tensortap")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 6007
#: how often the page asks whether anything changed (ms)
POLL_MS = 1000

_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def static_text(name: str) -> str:
    return resources.files("tensortap.ui").joinpath("static", name).read_text(encoding="utf-8")


#: plotly.js as the page loads it: npm's `plotly.js-cartesian-dist-min` (MIT licence, plotly-LICENSE.txt next
#: to it), vendored in static/ because it parses in a third of the time of the plotly package's full bundle
#: (1.5 MB against 4.8 MB) and has every trace type the views draw (scatter, bar, histogram, heatmap). Its
#: version is the plotly.js of the plotly package tested here (7.1.0); docs/ui.md says how to refresh it.
PLOTLY_BUNDLE = "plotly-cartesian-4.1.1.min.js"
#: the bundle's sha256, as `npm pack plotly.js-cartesian-dist-min@4.1.1` delivers it
PLOTLY_BUNDLE_SHA256 = "79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a"

_PLOTLY_JS: list[str] = []


def plotly_js() -> str:
    """The vendored plotly.js bundle's text (read once)."""
    if not _PLOTLY_JS:
        _PLOTLY_JS.append(static_text(PLOTLY_BUNDLE))
    return _PLOTLY_JS[0]


def plotly_name() -> str:
    """plotly.js's file name under /static/ (its version is in it: a browser may cache it for good)."""
    return PLOTLY_BUNDLE


def _plain(x: Any) -> Any:
    import numpy as np

    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON: {type(x).__name__}")


def to_json(obj: Any) -> str:
    return json.dumps(obj, default=_plain, allow_nan=False, separators=(",", ":"))


def signatures(jobs: JobSet, refresh: bool = False) -> list[dict[str, Any]]:
    """What the page compares to know that it must redraw: each job's signature (or its error)."""
    out = []
    for j in jobs.jobs:
        try:
            if refresh:
                j.refresh()
            out.append(j.signature())
        except Exception as e:  # noqa: BLE001 - a job that cannot be read now is reported, not fatal
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def create_app(jobs: JobSet) -> Any:
    from flask import Flask, Response, request

    app = Flask("tensortap.ui")
    app.json.sort_keys = False  # type: ignore[attr-defined]

    def reply(obj: Any, status: int = 200) -> Response:
        return Response(to_json(obj), status=status, mimetype="application/json")

    @app.after_request
    def _headers(resp: Response) -> Response:
        resp.headers["Content-Security-Policy"] = _CSP
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        if request.path.startswith("/api/"):
            resp.headers["Cache-Control"] = "no-store"
        return resp

    @app.get("/")
    def index() -> Response:
        page = static_text("index.html").replace("{{POLL_MS}}", str(POLL_MS)).replace(
            "{{PLOTLY_JS}}", plotly_name())
        return Response(page, mimetype="text/html")

    static = {"app.js": "application/javascript", "app.css": "text/css"}

    @app.get("/static/<name>")
    def static_file(name: str) -> Response:
        if name == plotly_name():
            resp = Response(plotly_js(), mimetype="application/javascript")
            # named by its version: a browser keeps it (and its compiled code) for the next visit
            resp.headers["Cache-Control"] = "public, max-age=31536000, immutable"
            return resp
        if name not in static:
            return reply({"error": f"no static file {name!r}"}, 404)
        return Response(static_text(name), mimetype=static[name])

    @app.get("/api/jobs")
    def api_jobs() -> Response:
        from tensortap.ui.views import available_views

        return reply({"jobs": [{"index": j.index, "name": j.name, "path": j.path} for j in jobs.jobs],
                      "views": available_views(jobs), "poll_ms": POLL_MS})

    @app.get("/api/view/<view>")
    def api_view(view: str) -> Response:
        from tensortap.ui.views import render_view

        params: dict[str, Any] = {k: request.args.get(k) for k in ("tensor", "page", "find")}
        params["job"] = request.args.getlist("job")
        try:
            sigs = signatures(jobs)  # before drawing: a change during the drawing is redrawn after
            blocks = render_view(jobs, view, params)
        except KeyError as e:
            return reply({"error": str(e.args[0] if e.args else e)}, 404)
        except Exception as e:  # noqa: BLE001 - a view that cannot be drawn says why, the server stays up
            logger.exception("tensortap ui: view %s failed", view)
            return reply({"error": f"{type(e).__name__}: {e}"}, 500)
        return reply({"view": view, "blocks": blocks, "jobs": sigs})

    @app.get("/api/series")
    def api_series() -> Response:
        """One curve's points for a zoom: ?job=I&tensor=NAME&mode=TRAIN&lo=STEP&hi=STEP (views.series_window)."""
        from tensortap.ui.views import series_window

        try:
            job = jobs.get(request.args.get("job", ""))
            lo, hi = float(request.args.get("lo", "")), float(request.args.get("hi", ""))
            if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
                raise ValueError
            return reply(series_window(job, request.args.get("tensor", ""), request.args.get("mode", "GLOBAL"),
                                       lo, hi))
        except KeyError as e:
            return reply({"error": str(e.args[0] if e.args else e)}, 404)
        except ValueError as e:
            return reply({"error": f"lo, hi: two finite steps, lo <= hi; mode: TRAIN, EVAL, PREDICT or GLOBAL "
                                   f"({e})"}, 400)

    @app.get("/api/poll")
    def api_poll() -> Response:
        return reply({"jobs": signatures(jobs, refresh=True)})

    return app


class Server:
    """The dashboard's HTTP server on a background thread (port 0: any free port)."""

    def __init__(self, paths: list[str], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT):
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.jobs = JobSet(paths)
        for j in self.jobs.jobs:
            j.warm()  # index the job and read its curves now, not on the page's first request
        self.app = create_app(self.jobs)
        try:
            self.httpd = make_server(host, port, self.app, threaded=True)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        except SystemExit:  # werkzeug's answer to a port in use (it has said so on stderr)
            raise ValueError(f"cannot listen on {host}:{port}: the port is in use") from None
        self.host = host
        self.port = self.httpd.server_port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="tensortap-ui", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def serve(paths: list[str], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> int:
    """Run the dashboard until interrupted; prints its URL."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"tensortap ui: warning: listening on {host}: anyone who can reach this address can read these "
              "jobs' data (there is no authentication)", file=sys.stderr)
    server = Server(paths, host, port)
    print(f"tensortap ui: serving {len(paths)} job(s) at {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
    return 0
