"""A small Keras 3 MLP (three Dense layers) trained for three epochs with validation, under tensortap's
KerasHook: weights, biases, gradients, losses and metrics every second step. Usage: train_keras.py OUT_DIR"""

import sys

import numpy as np

import tensortap.tensorflow as ttf

out = sys.argv[1]
import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype(np.float32)
y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="d1"),
                          keras.layers.Dense(16, activation="relu", name="d2"), keras.layers.Dense(3, name="d3")])
hook = ttf.KerasHook(out_dir=out, save_config=ttf.SaveConfig(save_interval=2),
                     include_collections=["weights", "biases", "gradients", "losses", "metrics"])
model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.Adam(0.01)),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=3, validation_data=(x[:64], y[:64]), callbacks=[hook], verbose=0)
hook.close()
print("training finished", flush=True)
