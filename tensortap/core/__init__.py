"""smdebug's `smdebug.core.*` import paths, for migration by changing imports: each module here is the
tensortap module that holds those names (the same module object, not a copy).

    tensortap.core.modes             -> tensortap.modes         (ModeKeys, ALLOWED_MODES, ...)
    tensortap.core.collection        -> tensortap.collection    (Collection, CollectionKeys, CollectionManager)
    tensortap.core.save_config       -> tensortap.config        (SaveConfig, SaveConfigMode)
    tensortap.core.reduction_config  -> tensortap.config        (ReductionConfig)
"""
