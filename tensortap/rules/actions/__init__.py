"""What a rule does when it fires: StopTraining, Webhook, Email, Command, Log.

Actions are attached to a rule (`actions=[...]`, or smdebug's JSON action string) and run on every firing
step with the rule's report. A failing action is logged and counted, never raised.
"""

from tensortap.rules.actions.base import Action, Actions, action_from_dict, parse_action_str
from tensortap.rules.actions.command import Command
from tensortap.rules.actions.email import Email
from tensortap.rules.actions.log import Log
from tensortap.rules.actions.stop import (
    STOP_EXIT_CODE,
    STOP_KEY,
    StopSignal,
    StopTraining,
    TrainingStopped,
    check_stop,
    clear_stop_request,
    request_stop,
    stop_requested,
)
from tensortap.rules.actions.webhook import Webhook

__all__ = [
    "Action",
    "Actions",
    "action_from_dict",
    "parse_action_str",
    "StopTraining",
    "Webhook",
    "Email",
    "Command",
    "Log",
    "StopSignal",
    "TrainingStopped",
    "STOP_KEY",
    "STOP_EXIT_CODE",
    "check_stop",
    "request_stop",
    "stop_requested",
    "clear_stop_request",
]
