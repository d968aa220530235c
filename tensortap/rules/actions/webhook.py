"""Webhook action: HTTP POST of the report JSON."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.actions.base import Action, positive_seconds

__all__ = ["Webhook"]


class Webhook(Action):
    """POST the report (JSON, Content-Type application/json) to `url`; a non-2xx answer counts as a failure."""

    name = "webhook"

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout: float = 10.0,
                 max_calls: int | None = None):
        super().__init__(max_calls)
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidConfiguration(f"Webhook: url={url!r} must be an http:// or https:// URL")
        if headers is not None and not (isinstance(headers, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
            raise InvalidConfiguration(f"Webhook: headers={headers!r} must be a dict of str to str")
        self.url = url
        self.headers = dict(headers or {})
        self.timeout = positive_seconds("Webhook", "timeout", timeout)
        self.last_status: int | None = None

    def run(self, report: dict[str, Any]) -> None:
        body = json.dumps(report, allow_nan=False).encode("utf-8")
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json",
                                              "User-Agent": "tensortap-rules", **self.headers})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - user-given URL
            self.last_status = resp.status
            resp.read()
        if not 200 <= (self.last_status or 0) < 300:
            raise RuntimeError(f"{self.url} answered HTTP {self.last_status}")

    def __repr__(self) -> str:
        return f"<Webhook {self.url}>"
