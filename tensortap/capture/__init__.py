"""The framework-neutral capture core: what every framework hook stands on.

* `tensortap.capture.writer`: the `Writer` contract (`typing.Protocol`) that the writer thread
  (`tensortap.format.writer.ChunkWriter`) and the writer process (`tensortap.transport.process_writer`) implement,
  with `Reservation`s that copy a batch of tensors in without the caller seeing an address; `open_writer` picks one.
* `tensortap.hooks.base.Hook`: the generic hook on top of it: the step clock (global step, mode steps, modes;
  steps a framework counts elsewhere are added before anything reads them), the save schedule (which
  collections save at a step, and the next one that saves anything), error isolation, and the hand-offs.
  Framework hooks (`tensortap.pytorch`, ...) subclass it and only adapt their framework's callbacks and tensors.

The core imports no ML framework and nothing of `tensortap.rules`.
"""
