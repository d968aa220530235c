"""Rules: checks evaluated over a trial, offline or beside a running job (smdebug's rules API).

    from tensortap.rules import invoke_rule
    from tensortap.rules.builtin import VanishingGradient
    from tensortap.rules.actions import StopTraining, Webhook

    rule = VanishingGradient(trial, threshold="1e-7", actions=[StopTraining()])
    report = invoke_rule(rule, stop_at_job_end=True, report_path="reports/")

`tensortap.rules.builtin` holds every SageMaker built-in rule; `tensortap.rules.configs` says what each one
needs saved; `tensortap.rules.actions` what to do when one fires.
"""

from tensortap.exceptions import InsufficientInformationForRuleInvocation, RuleEvaluationConditionMet
from tensortap.rules import actions, configs
from tensortap.rules.actions import (
    Action,
    Command,
    Email,
    Log,
    StopTraining,
    TrainingStopped,
    Webhook,
    check_stop,
    stop_requested,
)
from tensortap.rules.invoke import invoke_rule
from tensortap.rules.report import RuleReport, Verdict, Violation
from tensortap.rules.req_tensors import RequiredTensors
from tensortap.rules.rule import Rule

__all__ = [
    "Rule",
    "RequiredTensors",
    "invoke_rule",
    "RuleReport",
    "Verdict",
    "Violation",
    "RuleEvaluationConditionMet",
    "InsufficientInformationForRuleInvocation",
    "actions",
    "configs",
    "Action",
    "StopTraining",
    "Webhook",
    "Email",
    "Command",
    "Log",
    "TrainingStopped",
    "check_stop",
    "stop_requested",
]
