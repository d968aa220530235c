"""What the trainer callbacks share (`tensortap.lightning`, `tensortap.huggingface`): a step clock that follows the
trainer's optimizer steps, the model's weights and gradients read at the trainer's own hook points, the loss and
logged metrics as scalars, and rules run beside training that stop it through the trainer's own flag.
See docs/trainers.md."""
