"""`tensortap ui`: the live dashboard, a small Flask app over the jobs given on the command line.

Routes: `/` the page; `/static/<file>` its script, style and plotly.js (a bundle vendored in the package,
served from here: the page fetches nothing from elsewhere); `/api/jobs`; `/api/view/<view>?job=I&...` the blocks
of a view; `/api/poll` what changed (the page polls it every second and redraws when a job moved on).
A URL names a job only by its index among the jobs given on the command line.

Only requests whose `Host` names the address the server listens on are answered (a page elsewhere that makes
its own name resolve to 127.0.0.1, DNS rebinding, gets 403), and request parameters are bounded (400 naming
the bad one). A job whose folder disappears after the server started shows as gone, never as its old data.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import re
import socket
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

#: bounds on a view's request parameters: a longer query string is refused whole (414), a longer tensor name
#: or a larger page number is a 400
MAX_QUERY_BYTES = 8192
MAX_TENSOR_NAME = 1024
MAX_PAGE = 1_000_000
#: Host names every dashboard answers to, with its port: the loopback addresses by name and number
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_WILDCARD = ("", "0.0.0.0", "::")

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


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def allowed_hosts(host: str, port: int) -> tuple[frozenset[str], bool]:
    """The `Host` values a server listening on host:port answers: the loopback names and `host`, each with the
    port (and bare on port 80); the second value is True for a wildcard address (0.0.0.0, ::), which also answers
    this machine's names and any IP address (a literal address cannot be rebound to another site)."""
    names = {*LOOPBACK_NAMES, _bracketed(host.lower())}
    wildcard = host in _WILDCARD
    if wildcard:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    out = {f"{n}:{port}" for n in names if n}
    if port == 80:
        out |= {n for n in names if n}
    return frozenset(out), wildcard


def host_allowed(value: str, allowed: frozenset[str], wildcard: bool, port: int) -> bool:
    value = value.strip().lower()
    if value in allowed:
        return True
    if not wildcard:
        return False
    name, _, p = value.rpartition(":") if not value.endswith("]") else (value, "", "")
    if (p or "80") != str(port):
        return False
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def _folder_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


class GoneJobs:
    """Which jobs' folders disappeared (deleted, moved, or replaced by another folder) since the server started:
    their trials hold only what was read before, so they are shown as gone, with the reason."""

    def __init__(self, jobs: JobSet):
        self.jobs = jobs
        self._ids = {j.index: _folder_id(j.path) for j in jobs.jobs if "://" not in j.path}

    def reason(self, job: Any) -> str | None:
        if "://" in job.path:
            storage = getattr(job.trial.source, "storage", None)
            try:
                if storage is not None and not storage.has_keys(""):
                    return f"job {job.name}: {job.path} holds no objects any more (deleted): its data is gone"
            except Exception:  # noqa: BLE001 - an unreachable store is reported by the refresh, not here
                return None
            return None
        now = _folder_id(job.path)
        if now is None:
            return f"job {job.name}: its folder {job.path} no longer exists (deleted or moved): its data is gone"
        if now != self._ids.get(job.index):
            return (f"job {job.name}: its folder {job.path} was replaced by another folder since the dashboard "
                    "started: restart `tensortap ui` to show what it holds now")
        return None


def signatures(jobs: JobSet, refresh: bool = False, gone: GoneJobs | None = None) -> list[dict[str, Any]]:
    """What the page compares to know that it must redraw: each job's signature (or its error, or that it is
    gone)."""
    out = []
    for j in jobs.jobs:
        why = gone.reason(j) if gone is not None else None
        if why is not None:
            out.append({"gone": True, "ended": True, "error": why})
            continue
        try:
            if refresh:
                j.refresh()
            out.append(j.signature())
        except Exception as e:  # noqa: BLE001 - a job that cannot be read now is reported, not fatal
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


class BadRequest(ValueError):
    """A request parameter out of bounds: a 400 (or `status`) with the message."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


#: a job index or page number: ASCII digits only (str.isdigit takes '²', which int() refuses), a bounded count
_INDEX = re.compile(r"[0-9]{1,9}")


def view_params(args: Any, query: bytes, n_jobs: int) -> dict[str, Any]:
    """A view's parameters from the query string, bounded: each job once, by its index; one tensor name of at
    most MAX_TENSOR_NAME characters; one page number up to MAX_PAGE."""
    if len(query) > MAX_QUERY_BYTES:
        raise BadRequest(f"query string of {len(query)} bytes: at most {MAX_QUERY_BYTES} are allowed", 414)
    refs = args.getlist("job")
    seen: set[int] = set()
    for r in refs:
        if not _INDEX.fullmatch(r) or int(r) >= n_jobs:
            raise BadRequest(f"job={r[:40]!r}: allowed are 0..{n_jobs - 1} (the indices of the jobs given)")
        if int(r) in seen:
            raise BadRequest(f"job={r} is listed more than once: name each job once")
        seen.add(int(r))
    params: dict[str, Any] = {"job": refs}
    for k in ("tensor", "page", "find"):
        got = args.getlist(k)
        if len(got) > 1:
            raise BadRequest(f"{k} is given {len(got)} times: give it once")
        params[k] = got[0] if got else None
    for k in ("tensor", "find"):
        if params[k] is not None and len(params[k]) > MAX_TENSOR_NAME:
            raise BadRequest(f"{k} of {len(params[k])} characters: at most {MAX_TENSOR_NAME}")
    page = params["page"]
    if page is not None and not (_INDEX.fullmatch(page) and int(page) <= MAX_PAGE):
        raise BadRequest(f"page={page[:40]!r}: allowed are 0..{MAX_PAGE}")
    if page is None:
        del params["page"]
    return params


def create_app(jobs: JobSet, hosts: tuple[frozenset[str], bool, int] | None = None) -> Any:
    """The dashboard's Flask app; `hosts` is (allowed Host values, wildcard, port) as allowed_hosts gives them
    (default: the loopback names on any port, for an app served by something else)."""
    from flask import Flask, Response, request

    app = Flask("tensortap.ui")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    gone = GoneJobs(jobs)
    app.config["TENSORTAP_HOSTS"] = hosts

    def reply(obj: Any, status: int = 200) -> Response:
        return Response(to_json(obj), status=status, mimetype="application/json")

    @app.before_request
    def _only_our_host() -> Response | None:
        value = request.headers.get("Host", "")
        allowed = app.config.get("TENSORTAP_HOSTS")
        if allowed is None:
            ok = value.strip().lower().rsplit(":", 1)[0] in LOOPBACK_NAMES
        else:
            ok = host_allowed(value, *allowed)
        if ok:
            return None
        return reply({"error": f"Host {value[:100]!r} is not an address this dashboard listens on"}, 403)

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

        return reply({"jobs": [{"index": j.index, "name": j.name, "path": j.path, "gone": gone.reason(j)}
                               for j in jobs.jobs],
                      "views": available_views(jobs), "poll_ms": POLL_MS})

    @app.get("/api/view/<view>")
    def api_view(view: str) -> Response:
        from tensortap.ui.views import render_view

        try:
            params = view_params(request.args, request.query_string, len(jobs.jobs))
        except BadRequest as e:
            return reply({"error": str(e)}, e.status)
        chosen = jobs.select(params["job"] or None)
        gone_now = [(j, why) for j in chosen if (why := gone.reason(j)) is not None]
        if len(gone_now) == len(chosen):
            return reply({"error": " ".join(why for _, why in gone_now)}, 410)
        params["job"] = [str(j.index) for j in chosen if all(j is not g for g, _ in gone_now)]
        try:
            sigs = signatures(jobs, gone=gone)  # before drawing: a change during the drawing is redrawn after
            blocks = [{"type": "note", "text": why} for _, why in gone_now] + render_view(jobs, view, params)
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
            params = view_params(request.args, request.query_string, len(jobs.jobs))
        except BadRequest as e:
            return reply({"error": str(e)}, e.status)
        if len(params["job"]) != 1:
            return reply({"error": f"give one job=I (allowed are 0..{len(jobs.jobs) - 1})"}, 400)
        job = jobs.get(params["job"][0])
        why = gone.reason(job)
        if why is not None:
            return reply({"error": why}, 410)
        try:
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
        return reply({"jobs": signatures(jobs, refresh=True, gone=gone)})

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
        self.app.config["TENSORTAP_HOSTS"] = (*allowed_hosts(host, self.port), self.port)
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
