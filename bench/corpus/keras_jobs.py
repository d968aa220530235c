"""Keras trainings of the rules corpus: an MLP on the teacher data of torch_jobs, fit with validation data (one
evaluation per epoch). `train(out_dir, **spec)` passes tensortap's KerasHook when `out_dir` is given."""

from __future__ import annotations

from bench.corpus.torch_jobs import _teacher_data

COLLECTIONS = ["weights", "biases", "gradients", "losses", "metrics"]


def train(out_dir: str | None, *, seed: int = 0, lr: float = 1e-3, batch: int = 32, epochs: int = 6,
          n_train: int = 2048, n_val: int = 512, width: int = 64, save_interval: int = 10,
          optimizer: str = "adam") -> None:
    import keras

    keras.utils.set_random_seed(seed)
    x, y = _teacher_data(seed, n_train + n_val)
    model = keras.Sequential([keras.Input((x.shape[1],)), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dense(width, activation="relu"), keras.layers.Dense(4)])
    opt = keras.optimizers.Adam(lr) if optimizer == "adam" else keras.optimizers.SGD(lr, momentum=0.9)
    callbacks = []
    if out_dir is not None:
        import tensortap.tensorflow as ttf

        hook = ttf.KerasHook(out_dir=out_dir, save_config=ttf.SaveConfig(save_interval=save_interval),
                             include_collections=list(COLLECTIONS))
        opt = hook.wrap_optimizer(opt)
        callbacks.append(hook)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x[:n_train], y[:n_train], batch_size=batch, epochs=epochs, verbose=0,
              validation_data=(x[n_train:], y[n_train:]), validation_batch_size=128, callbacks=callbacks)
    for c in callbacks:
        c.close()
