"""tensortap: see inside training. Capture tensors with a Hook, query them with a Trial, watch with rules.

Importing tensortap imports no ML framework, boto3 or pandas.
"""

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys, CollectionManager
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.hooks.base import Hook
from tensortap.trials import create_trial
from tensortap.trials.state import StepState

__version__ = "0.1.0"

__all__ = [
    "Hook",
    "SaveConfig",
    "SaveConfigMode",
    "ReductionConfig",
    "Collection",
    "CollectionKeys",
    "CollectionManager",
    "StepState",
    "modes",
    "create_trial",
]
