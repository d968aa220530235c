"""The framework-neutral capture core: what every framework hook stands on.

* `tensortap.capture.writer`: the `Writer` contract (`typing.Protocol`) that the writer thread
  (`tensortap.format.writer.ChunkWriter`) and the writer process (`tensortap.transport.process_writer`) implement,
  with `Reservation`s that copy a batch of tensors in without the caller seeing an address; `open_writer` picks one.
* `tensortap.capture.clock`: the step clock (global step, mode steps, modes) and the save schedule (which
  collections save at a step, and the next step that saves anything), so a step that saves nothing costs a
  counter.
* `tensortap.hooks.base.Hook`: the generic hook built on both; framework hooks (`tensortap.pytorch`, ...) subclass
  it and only adapt their framework's callbacks and tensors.

The core imports no ML framework and nothing of `tensortap.rules`.
"""
