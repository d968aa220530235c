"""TensorBoard export: event files written live by a hook's writer, or converted from any saved job.

`tensortap.tensorboard.export.EventExporter` turns the records a writer persists into TensorBoard event
files; `tensortap.tensorboard.convert.convert` does the same for a saved job read through a trial
(`tensortap tensorboard OUT_DIR --logdir DIR`). The layout is specified in docs/tensorboard.md.

Importing tensortap does not import this package, and this package never imports TensorBoard itself
(only `--serve` starts its server, as a separate process).
"""
