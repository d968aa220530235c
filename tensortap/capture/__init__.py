"""The framework-neutral capture core: what every framework hook stands on.

* `tensortap.capture.writer`: the `Writer` contract (`typing.Protocol`) that the writer thread
  (`tensortap.transport.thread_writer.ChunkWriter`) and the writer process (`tensortap.transport.process_writer`)
  implement around the same encoder (`tensortap.format.writer.ChunkEncoder`), with `Reservation`s that copy a batch
  of tensors in without the caller seeing an address; `open_writer` makes one.
* `tensortap.capture.clock.StepClock`: the global step, each mode's step and the current mode; steps a framework
  counts elsewhere (a tally) are added before anything reads them.
* `tensortap.capture.schedule.SaveSchedule`: which included collections save at a step of a mode, which of them
  contain a tensor, and the next step that saves anything (the steps before it only count).
* `tensortap.capture.batch`: a step's raw tensors of one dtype as one message copied straight into the writer's
  room (`BatchSpec`, `StepLayout` for a message begun at the step's start and finished at its end).
* `tensortap.capture.engine.StepEngine`: the step policy every framework shares (the saving flag, the quiet
  window, late identity, the plan cache, held step marks, the step lifecycle listeners hear); with
  `tensortap.capture.handoff` (a step's tensors to the writer) and `tensortap.capture.identity` (rank, worker,
  the claim of its folder). docs/capture.md.
* `tensortap.hooks.base.Hook`: the generic hook on top of them: construction and validation, error isolation,
  collections, stop requests and the hand-offs (`write_tensors` sends a step's raw values as one batch). Framework
  hooks (`tensortap.pytorch`, ...) subclass it and only adapt their framework's callbacks and tensors.

The core imports no ML framework and nothing of `tensortap.rules`.
"""
