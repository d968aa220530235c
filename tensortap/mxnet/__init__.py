"""tensortap for MXNet Gluon (MXNet 1.9), mirroring `smdebug.mxnet`.

    import tensortap.mxnet as tm
    hook = tm.Hook(out_dir="runs/job1", save_config=tm.SaveConfig(save_interval=10),
                   include_collections=["weights", "biases", "gradients", "losses"])
    hook.register_block(net)
    hook.register_block(loss_fn)

Needs `pip install tensortap[mxnet]` (MXNet 1.9.1 needs numpy<1.24).
"""

from tensortap import modes
from tensortap.collection import Collection, CollectionKeys
from tensortap.config import ReductionConfig, SaveConfig, SaveConfigMode
from tensortap.mxnet.hook import Hook
from tensortap.mxnet.singleton import del_hook, get_hook, set_hook
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
