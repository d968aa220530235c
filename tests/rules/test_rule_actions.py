"""Actions, for real: an HTTP server and an SMTP server on 127.0.0.1, a real command."""

import json
import logging
import sys
import threading
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules import invoke_rule
from tensortap.rules.actions import Command, Email, Log, Webhook
from tensortap.rules.builtin import VanishingGradient


@pytest.fixture
def vanishing(job):
    return job(6, {"gradient/w": ("gradients", lambda s: np.full(4, 1e-9 if s >= 3 else 1.0, np.float32))})


@pytest.fixture
def http_server():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, self.headers["Content-Type"], json.loads(body)))
            self.send_response(500 if self.path == "/fail" else 200)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", received
    srv.shutdown()
    srv.server_close()


def test_webhook_posts_the_report(vanishing, http_server):
    url, received = http_server
    hook = Webhook(url + "/alerts", max_calls=2)
    rep = invoke_rule(VanishingGradient(vanishing, actions=[hook]), stop_at_job_end=True)
    assert rep.fired_steps == [3, 4, 5]
    assert len(received) == 2 and hook.calls == 2 and hook.last_status == 200
    path, ctype, body = received[0]
    assert path == "/alerts" and ctype == "application/json"
    assert body["rule"] == "VanishingGradient" and body["event"]["step"] == 3
    assert body["event"]["violations"][0]["tensor"] == "gradient/w"
    assert body["parameters"] == {"threshold": 1e-07}


def test_failing_actions_are_logged_not_raised(vanishing, http_server, free_port, caplog):
    url, _ = http_server
    bad_status = Webhook(url + "/fail")
    refused = Webhook(f"http://127.0.0.1:{free_port}/", timeout=2)
    failing_cmd = Command([sys.executable, "-c", "import sys; sys.exit(4)"])
    with caplog.at_level(logging.ERROR, logger="tensortap.rules.actions"):
        rep = invoke_rule(VanishingGradient(vanishing, actions=[bad_status, refused, failing_cmd]),
                          stop_at_job_end=True)
    assert rep.violations == 3
    assert bad_status.failures == refused.failures == failing_cmd.failures == 3
    assert "exited with status 4" in caplog.text
    # each failing action: one line at its first failure, one summary with the count when the rule ends
    lines = [r.getMessage() for r in caplog.records]
    for name in ("webhook", "command"):
        first = [m for m in lines if f"action {name} of rule VanishingGradient failed" in m]
        summary = [m for m in lines if f"action {name} failed 3 of 3 time(s)" in m]
        assert len(first) == {"webhook": 2, "command": 1}[name] and len(summary) == len(first), lines
    assert sum("failed 3 of 3 time(s)" in w for w in rep.warnings) == 3


def test_offline_stop_training_writes_nothing_into_a_finished_job(vanishing):
    import os

    from tensortap.rules.actions import StopTraining

    stop = StopTraining()
    rep = invoke_rule(VanishingGradient(vanishing, actions=[stop]), stop_at_job_end=True)
    assert rep.violations == 3 and stop.skipped == 3 and stop.failures == 0 and stop.location is None
    assert not os.path.exists(os.path.join(vanishing.path, "tensortap", "control", "stop.json"))


def test_email_through_a_local_smtp_server(vanishing, free_port, monkeypatch):
    from aiosmtpd.controller import Controller

    got = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802
            got.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content))
            return "250 OK"

    ctl = Controller(Handler(), hostname="127.0.0.1", port=free_port)
    ctl.start()
    try:
        monkeypatch.setenv("TENSORTAP_SMTP_HOST", "127.0.0.1")
        monkeypatch.setenv("TENSORTAP_SMTP_PORT", str(free_port))
        monkeypatch.setenv("TENSORTAP_SMTP_FROM", "rules@example.org")
        rule = VanishingGradient(vanishing, action_str=json.dumps({"name": "email", "endpoint": "ml@example.org"}))
        assert isinstance(rule.actions.actions[0], Email)
        rule.actions.actions[0].max_calls = 1
        invoke_rule(rule, stop_at_job_end=True)
        direct = Email(to="a@example.org, b@example.org", host="127.0.0.1", port=free_port, max_calls=1)
        invoke_rule(VanishingGradient(vanishing, actions=[direct]), stop_at_job_end=True)
    finally:
        ctl.stop()
    assert len(got) == 2
    sender, rcpt, content = got[0]
    assert sender == "rules@example.org" and rcpt == ["ml@example.org"]
    msg = message_from_bytes(content)
    assert msg["Subject"] == "tensortap rule VanishingGradient fired at step 3"
    body = msg.get_payload(decode=True).decode()
    assert "gradient/w" in body and '"first_fired_step": 3' in body
    assert got[1][1] == ["a@example.org", "b@example.org"]


def test_command_gets_the_report_on_stdin(vanishing, tmp_path):
    out = tmp_path / "got.json"
    code = ("import json, os, sys; r = json.load(sys.stdin); "
            f"open({str(out)!r}, 'w').write(json.dumps([r['event']['step'], os.environ['TENSORTAP_RULE_NAME']]))")
    cmd = Command([sys.executable, "-c", code], max_calls=1)
    invoke_rule(VanishingGradient(vanishing, actions=[cmd]), stop_at_job_end=True)
    assert json.loads(out.read_text()) == [3, "VanishingGradient"] and cmd.failures == 0


def test_log_action(vanishing, caplog):
    with caplog.at_level(logging.WARNING, logger="tensortap.rules"):
        invoke_rule(VanishingGradient(vanishing, actions=[Log(max_calls=1)]), stop_at_job_end=True)
    assert "rule VanishingGradient fired at step 3: gradient/w" in caplog.text


def test_invalid_action_arguments():
    with pytest.raises(InvalidConfiguration):
        Webhook("ftp://x")
    with pytest.raises(InvalidConfiguration):
        Email(to="not-an-address")
    with pytest.raises(InvalidConfiguration):
        Command("")
