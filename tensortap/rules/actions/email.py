"""Email action: the report by SMTP."""

from __future__ import annotations

import json
import os
import smtplib
import ssl
from email.message import EmailMessage
from typing import Any

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.actions.base import Action, positive_seconds

__all__ = ["Email"]

ENV = {
    "host": "TENSORTAP_SMTP_HOST",
    "port": "TENSORTAP_SMTP_PORT",
    "username": "TENSORTAP_SMTP_USER",
    "password": "TENSORTAP_SMTP_PASSWORD",
    "sender": "TENSORTAP_SMTP_FROM",
    "security": "TENSORTAP_SMTP_SECURITY",
}


class Email(Action):
    """Send the report to `to` (one address, a comma list or a list) through an SMTP server.

    Server settings come from the arguments, else from the environment: TENSORTAP_SMTP_HOST (default
    localhost), TENSORTAP_SMTP_PORT (default 25, or 465 with security="ssl"), TENSORTAP_SMTP_USER,
    TENSORTAP_SMTP_PASSWORD, TENSORTAP_SMTP_FROM (default tensortap@<host>), TENSORTAP_SMTP_SECURITY
    ("none", "starttls" or "ssl"; default none). The subject is "tensortap rule <rule> fired at step <s>";
    the body is a short summary followed by the report JSON.
    """

    name = "email"
    OPTIONS = ("host", "port", "username", "password", "sender", "security", "timeout", "subject")

    def __init__(self, to: str | list[str], host: str | None = None, port: int | str | None = None,
                 username: str | None = None, password: str | None = None, sender: str | None = None,
                 security: str | None = None, timeout: float = 10.0, subject: str | None = None,
                 max_calls: int | None = None):
        super().__init__(max_calls)
        if not (isinstance(to, str) or (isinstance(to, list | tuple) and all(isinstance(a, str) for a in to))):
            raise InvalidConfiguration(f"Email: to={to!r} must be an e-mail address or a list of them")
        for k, v in (("host", host), ("username", username), ("password", password), ("sender", sender),
                     ("security", security), ("subject", subject)):
            if v is not None and not isinstance(v, str):
                raise InvalidConfiguration(f"Email: {k}={v!r} must be a string")
        rcpt = [a.strip() for a in (to.split(",") if isinstance(to, str) else list(to)) if a and a.strip()]
        if not rcpt or not all("@" in a for a in rcpt):
            raise InvalidConfiguration(f"Email: to={to!r} must be one or more e-mail addresses")
        self.to = rcpt
        self.host = host or os.environ.get(ENV["host"], "localhost")
        self.security = (security or os.environ.get(ENV["security"], "none")).strip().lower()
        if self.security not in ("none", "starttls", "ssl"):
            raise InvalidConfiguration(f"Email: security={self.security!r}: allowed are none, starttls, ssl")
        port = port if port is not None else os.environ.get(ENV["port"])
        try:
            self.port = int(port) if port is not None else (465 if self.security == "ssl" else 25)
        except (ValueError, TypeError):
            raise InvalidConfiguration(f"Email: port={port!r} must be an integer") from None
        if isinstance(port, bool) or not 0 < self.port < 65536:
            raise InvalidConfiguration(f"Email: port={port!r} must be a TCP port (1-65535)")
        self.username = username if username is not None else os.environ.get(ENV["username"])
        self.password = password if password is not None else os.environ.get(ENV["password"])
        self.sender = sender or os.environ.get(ENV["sender"]) or f"tensortap@{self.host}"
        self.timeout = positive_seconds("Email", "timeout", timeout)
        self.subject = subject

    def message(self, report: dict[str, Any]) -> EmailMessage:
        ev = report.get("event", {})
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.to)
        msg["Subject"] = self.subject or f"tensortap rule {report.get('rule')} fired at step {ev.get('step')}"
        lines = [f"Rule {report.get('rule')} fired at step {ev.get('step')} on trial {report.get('trial')}.", ""]
        for v in ev.get("violations", [])[:20]:
            lines.append(f"  {v.get('tensor') or '-'} @ step {v.get('step')}: {v.get('condition')}")
        lines += ["", "Report:", json.dumps(report, indent=2)]
        msg.set_content("\n".join(lines))
        return msg

    def run(self, report: dict[str, Any]) -> None:
        msg = self.message(report)
        if self.security == "ssl":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(self.host, self.port, timeout=self.timeout,
                                                  context=ssl.create_default_context())
        else:
            smtp = smtplib.SMTP(self.host, self.port, timeout=self.timeout)
        with smtp:
            if self.security == "starttls":
                smtp.starttls(context=ssl.create_default_context())
            if self.username:
                smtp.login(self.username, self.password or "")
            smtp.send_message(msg)

    def __repr__(self) -> str:
        return f"<Email to={self.to} via {self.host}:{self.port}>"
