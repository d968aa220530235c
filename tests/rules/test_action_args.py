"""Rule actions refuse bad arguments when they are made, naming the bad value."""

from __future__ import annotations

import pytest

from tensortap.exceptions import InvalidConfiguration
from tensortap.rules.actions.command import Command
from tensortap.rules.actions.email import Email
from tensortap.rules.actions.log import Log
from tensortap.rules.actions.webhook import Webhook


@pytest.mark.parametrize("make, needle", [
    (lambda: Webhook("http://127.0.0.1:1/x", timeout=-1), "timeout=-1"),
    (lambda: Webhook("http://127.0.0.1:1/x", timeout=float("nan")), "timeout=nan"),
    (lambda: Webhook("http://127.0.0.1:1/x", headers={"a": 1}), "headers="),
    (lambda: Command("ls", timeout="x"), "timeout='x'"),
    (lambda: Command("ls", timeout=0), "timeout=0"),
    (lambda: Command("ls", shell="yes"), "shell='yes'"),
    (lambda: Email("a@b.c", timeout=-3), "timeout=-3"),
    (lambda: Email(5), "to=5"),
    (lambda: Email("a@b.c", port=70000), "port=70000"),
    (lambda: Email("a@b.c", security=1), "security=1"),
    (lambda: Log(level=None), "level=None"),
])
def test_bad_action_arguments_fail_at_construction(make, needle):
    with pytest.raises(InvalidConfiguration) as ei:
        make()
    assert needle in str(ei.value)


def test_numeric_strings_from_json_action_strings_are_seconds():
    assert Command("ls", timeout="2.5").timeout == 2.5
    assert Webhook("http://127.0.0.1:1/x", timeout=3).timeout == 3.0
