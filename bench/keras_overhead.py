"""Overhead of tensortap's KerasHook on `model.fit`, against no hook and Keras's own TensorBoard callback.

Two models (an MLP and a small CNN), TensorFlow backend on CPU with one intra-op thread. For each save
interval k (10 and 100), every variant trains in epochs of k steps (so TensorBoard's histogram_freq=1, one
histogram set per epoch, saves exactly as often as tensortap's save_interval=k), in blocks of `--steps`
steps per `fit` call. The variants alternate within each round (none, none-again, noop, tensortap,
tensorboard, in a rotating order; `none-again` is a second model with no callback, the A/A control; `noop` is an
empty callback with batch methods, the floor for any callback); the first round is a warm-up (tracing) and is
not counted. Ratio = the variant's block time over the no-hook block time of the same round; the table gives
the median over rounds, of wall time, of the CPU time of the training process plus tensortap's writer process
(a tensortap block waits for its writer to catch up at its end) and of the CPU time of the training thread
alone (where every callback runs; TensorFlow's own threads, e.g. tf.data's, are not in it). The A/A control
shows which of them is steady enough on the machine of the day.

    .venv/bin/python bench/keras_overhead.py [--rounds 7] [--steps 200]

tensortap saves weights, biases, gradients (through wrap_optimizer) and losses; TensorBoard saves the
weight histograms and the epoch's scalars.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import numpy as np  # noqa: E402


def build(kind: str):
    import keras

    if kind == "mlp":
        layers = [keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                  keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
    else:
        layers = [keras.Input((16, 16, 1)), keras.layers.Conv2D(8, 3, activation="relu"),
                  keras.layers.MaxPooling2D(), keras.layers.Conv2D(16, 3, activation="relu"),
                  keras.layers.Flatten(), keras.layers.Dense(10)]
    return keras.Sequential(layers)


def dataset(kind: str):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    n, batch = (1024, 64) if kind == "mlp" else (512, 32)
    shape = (n, 64) if kind == "mlp" else (n, 16, 16, 1)
    x = rng.normal(size=shape).astype("float32")
    y = rng.integers(0, 10, n)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True).repeat().prefetch(2)


def variants(kind: str, k: int, tmp: str, tensorboard: bool = True):
    import keras

    import tensortap.tensorflow as ttf

    out = {}
    class Noop(keras.callbacks.Callback):
        """The floor of any callback with batch methods: Keras then calls it synchronously at every step,
        with the step's logs converted to Python numbers."""

        def on_train_batch_begin(self, batch, logs=None):
            pass

        def on_train_batch_end(self, batch, logs=None):
            pass

    for name in ("none", "none-again", "noop", "tensortap") + (("tensorboard",) if tensorboard else ()):
        keras.utils.set_random_seed(0)
        model = build(kind)
        opt = keras.optimizers.SGD(0.01)
        cbs = []
        if name == "tensortap":
            hook = ttf.KerasHook(out_dir=os.path.join(tmp, f"tt-{kind}-{k}"),
                                 save_config=ttf.SaveConfig(save_interval=k),
                                 include_collections=["weights", "biases", "gradients", "losses"])
            opt = hook.wrap_optimizer(opt)
            cbs = [hook]
        elif name == "noop":
            cbs = [Noop()]
        elif name == "tensorboard":
            cbs = [keras.callbacks.TensorBoard(log_dir=os.path.join(tmp, f"tb-{kind}-{k}"), histogram_freq=1)]
        model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        out[name] = (model, cbs)
    return out


def _median(by_variant: dict[str, list[float]], name: str) -> float:
    return statistics.median(by_variant[name]) if by_variant.get(name) else float("nan")


def _writer_cpu(cbs: list) -> float:
    """CPU seconds of tensortap's writer process so far (0 without one)."""
    proc = getattr(getattr(cbs[0], "_writer", None), "_proc", None) if cbs else None
    if proc is None:
        return 0.0
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _drain(cbs: list) -> None:
    """Wait until tensortap's writer has handled what the block handed it: its work is charged to the block."""
    w = getattr(cbs[0], "_writer", None) if cbs else None
    if w is not None and hasattr(w, "drain"):
        w.drain()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--no-tensorboard", action="store_true", help="leave the TensorBoard callback out")
    args = ap.parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.models.split(","):
            data = dataset(kind)
            for k in (10, 100):
                vs = variants(kind, k, tmp, not args.no_tensorboard)
                names = list(vs)
                ratios: dict[str, list[float]] = {n: [] for n in names if n != "none"}
                cpu_ratios: dict[str, list[float]] = {n: [] for n in names if n != "none"}
                thread_ratios: dict[str, list[float]] = {n: [] for n in names if n != "none"}
                plain_ms: list[float] = []
                for r in range(args.rounds + 1):
                    order = names[r % len(names):] + names[:r % len(names)]
                    times, cpu, thread = {}, {}, {}
                    for n in order:
                        model, cbs = vs[n]
                        w0 = _writer_cpu(cbs)
                        t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
                        model.fit(data, epochs=args.steps // k, steps_per_epoch=k, callbacks=cbs, verbose=0)
                        _drain(cbs)
                        times[n], cpu[n] = time.perf_counter() - t0, time.process_time() - c0 + _writer_cpu(cbs) - w0
                        thread[n] = time.thread_time() - h0
                    if r == 0:
                        continue  # warm-up: tracing
                    plain_ms.append(1000 * times["none"] / args.steps)
                    for n in ratios:
                        ratios[n].append(times[n] / times["none"])
                        cpu_ratios[n].append(cpu[n] / cpu["none"])
                        thread_ratios[n].append(thread[n] / thread["none"])
                hook = vs["tensortap"][1][0]
                hook.close()
                assert hook.error_count == 0, hook.first_error
                row = (kind, k, statistics.median(plain_ms), statistics.median(ratios["noop"]),
                       statistics.median(ratios["tensortap"]), _median(ratios, "tensorboard"),
                       statistics.median(cpu_ratios["tensortap"]), _median(cpu_ratios, "tensorboard"),
                       statistics.median(thread_ratios["tensortap"]), _median(thread_ratios, "tensorboard"),
                       statistics.median(thread_ratios["none-again"]))
                rows.append(row)
                print(f"{kind} every {k}: plain {row[2]:.3f} ms/step, empty callback x{row[3]:.3f}, "
                      f"tensortap x{row[4]:.3f} (rounds: {' '.join(f'{x:.3f}' for x in ratios['tensortap'])}), "
                      f"TensorBoard(histogram_freq=1) x{row[5]:.3f}; CPU time of the training process: "
                      f"tensortap x{row[6]:.3f}, TensorBoard x{row[7]:.3f}; of the training thread: "
                      f"tensortap x{row[8]:.3f} "
                      f"(rounds: {' '.join(f'{x:.3f}' for x in thread_ratios['tensortap'])}), TensorBoard "
                      f"x{row[9]:.3f}; A/A (a second model, no callback): thread CPU x{row[10]:.3f} (rounds: "
                      f"{' '.join(f'{x:.3f}' for x in thread_ratios['none-again'])}), wall "
                      f"x{statistics.median(ratios['none-again']):.3f}, "
                      f"CPU x{statistics.median(cpu_ratios['none-again']):.3f}"
                      f" (rounds: {' '.join(f'{x:.3f}' for x in cpu_ratios['none-again'])}); tensortap CPU rounds: "
                      f"{' '.join(f'{x:.3f}' for x in cpu_ratios['tensortap'])}", flush=True)
    print()
    print(f"keras {keras.__version__}, tensorflow {tf.__version__}, python {sys.version.split()[0]}, "
          f"{args.rounds} rounds of {args.steps} steps, load average {os.getloadavg()[0]:.1f}")
    print("| model | save every | plain ms/step | empty callback | tensortap | TensorBoard(histogram_freq=1) "
          "| tensortap CPU | TensorBoard CPU | tensortap thread CPU | TensorBoard thread CPU | A/A thread CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, k, ms, noop, t, tb, tc, tbc, th, tbh, aa in rows:
        print(f"| {kind} | {k} | {ms:.3f} | x{noop:.3f} | x{t:.3f} | x{tb:.3f} | x{tc:.3f} | x{tbc:.3f} "
              f"| x{th:.3f} | x{tbh:.3f} | x{aa:.3f} |")


if __name__ == "__main__":
    main()
