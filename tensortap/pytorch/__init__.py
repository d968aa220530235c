"""tensortap for PyTorch, mirroring `smdebug.pytorch`.

    import tensortap.pytorch as tp
    hook = tp.Hook(out_dir="runs/job1", save_config=tp.SaveConfig(save_interval=10),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_module(model)
    hook.register_loss(loss_fn)
"""

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.pytorch.hook import Hook
from tensortap.pytorch.singleton import del_hook, get_hook, set_hook
from tensortap.trials import create_trial

__all__ = [
    "Hook",
    "SaveConfig",
    "SaveConfigMode",
    "ReductionConfig",
    "Collection",
    "CollectionKeys",
    "modes",
    "create_trial",
    "get_hook",
    "set_hook",
    "del_hook",
]
