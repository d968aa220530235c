"""Distribution strategies: MirroredStrategy over two logical CPU devices in one process, and
MultiWorkerMirroredStrategy across two processes on 127.0.0.1 (each test runs its jobs in subprocesses)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

pytest.importorskip("tensorflow")

COMMON = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tensorflow as tf
    BASE = sys.argv[1]
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    import keras
    import tensortap.tensorflow as ttf
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32"); y = rng.integers(0, 3, 64)
    np.save(os.path.join(BASE, "x.npy"), x)
    for iw in ("one", "all"):
        keras.utils.set_random_seed(0)
        hook = ttf.KerasHook(out_dir=os.path.join(BASE, iw), save_config=ttf.SaveConfig(save_interval=1),
                             include_workers=iw, include_collections=["weights", "gradients", "losses", "inputs"])
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="d1"),
                                      keras.layers.Dense(3, name="d2")], name="sequential")
            model.compile(optimizer=hook.wrap_optimizer(keras.optimizers.SGD(0.1)),
                          loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, callbacks=[hook], verbose=0)
        hook.close()
        assert hook.error_count == 0, hook.first_error
    """
)


MULTI_WORKER = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import tensorflow as tf
    BASE = sys.argv[1]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    import tensortap.tensorflow as ttf
    for iw in ("one", "all"):
        hook = ttf.KerasHook(out_dir=os.path.join(BASE, iw), save_config=ttf.SaveConfig(save_interval=2),
                             include_workers=iw, include_collections=["weights", "gradients", "losses"])
        with strategy.scope():
            w = tf.Variable(tf.ones((4, 1)), name="w", aggregation=tf.VariableAggregation.MEAN)
        rng = np.random.default_rng(hook.rank)
        x = rng.normal(size=(4, 8, 4)).astype("float32"); y = rng.normal(size=(4, 8, 1)).astype("float32")

        @tf.function
        def train_step(xb, yb):
            def step(xb, yb):
                with hook.wrap_tape(tf.GradientTape()) as tape:
                    loss = tf.reduce_mean(tf.square(xb @ w - yb))
                (g,) = tape.gradient(loss, [w])
                w.assign_sub(0.1 * tf.distribute.get_replica_context().all_reduce("MEAN", g))
                return loss
            return strategy.run(step, args=(xb, yb))

        losses = [strategy.experimental_local_results(train_step(x[i], y[i]))[0].numpy() for i in range(4)]
        hook.close()
        assert hook.error_count == 0, hook.first_error
        np.save(os.path.join(BASE, f"losses_{iw}_{hook.rank}.npy"), np.array(losses))
    # no worker leaves before every worker is done (a worker gone early aborts the others' collectives)
    import time
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(BASE, f"losses_all_{r}.npy")) for r in (0, 1)):
        time.sleep(0.1)
    """
)


def _env(**extra):
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", **extra)


def test_mirrored_two_devices(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(COMMON)
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=300,
                       env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    x = np.load(tmp_path / "x.npy")
    for include_workers, workers in (("one", ["worker_0"]), ("all", ["worker_0", "worker_1"])):
        tr = tt.create_trial(str(tmp_path / include_workers))
        assert tr.workers() == workers
        assert tr.steps(mode=tt.modes.TRAIN) == [0, 1, 2, 3]
        # each device's half of the global batch of step 2 (rows 32..47)
        for i, w in enumerate(workers):
            np.testing.assert_array_equal(tr.tensor("inputs").value(2, worker=w), x[32 + 8 * i: 40 + 8 * i])
            assert tr.tensor("gradients/sequential/d2/kernelGrad").value(2, worker=w).shape == (8, 3)
    for n in ("d1/weights/sequential/d1/kernel", "loss"):  # mirrored: the same on both devices
        np.testing.assert_array_equal(tr.tensor(n).value(2, worker="worker_0"),
                                      tr.tensor(n).value(2, worker="worker_1"))
    # each device's own gradients (before the all-reduce): SGD(0.1) applies their sum
    g = sum(tr.tensor("gradients/sequential/d2/kernelGrad").value(0, worker=w) for w in workers)
    w0 = tr.tensor("d2/weights/sequential/d2/kernel").value(0, worker="worker_0")
    w1 = tr.tensor("d2/weights/sequential/d2/kernel").value(1, worker="worker_0")
    np.testing.assert_allclose(w1, w0 - 0.1 * g, rtol=1e-5, atol=1e-6)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_multi_worker_two_processes(tmp_path):
    """A MultiWorkerMirroredStrategy job of two processes on 127.0.0.1 (a GradientTape loop in a tf.function:
    Keras 3.15's own fit fails under this strategy here, with or without tensortap)."""
    script = tmp_path / "job.py"
    script.write_text(MULTI_WORKER)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(2)]}
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(TF_CONFIG=json.dumps({"cluster": cluster,
                                                              "task": {"type": "worker", "index": i}})))
             for i in range(2)]
    try:
        for p in procs:
            _out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for include_workers, workers in (("one", ["worker_0"]), ("all", ["worker_0", "worker_1"])):
        tr = tt.create_trial(str(tmp_path / include_workers))
        assert tr.workers() == workers
        assert tr.steps(mode=tt.modes.TRAIN) == [0, 2]
        for rank, w in enumerate(workers):
            losses = np.load(tmp_path / f"losses_{include_workers}_{rank}.npy")
            for s in (0, 2):
                assert tr.tensor("loss").value(s, worker=w) == losses[s]  # each worker's own batch
    # one model: the same weights on both workers
    np.testing.assert_array_equal(tr.tensor("weights/w").value(2, worker="worker_0"),
                                  tr.tensor("weights/w").value(2, worker="worker_1"))
    assert tr.tensor("loss").value(2, worker="worker_0") != tr.tensor("loss").value(2, worker="worker_1")


@pytest.mark.parametrize("include_workers", ["one", "all"])
def test_multi_worker_ranks_from_tf_config(tmp_path, monkeypatch, include_workers):
    """MultiWorkerMirroredStrategy names its processes in TF_CONFIG: each hook is worker_<rank> of the
    cluster (chief first), and only worker_0 writes with include_workers="one"."""
    import tensortap.tensorflow as ttf

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    for kind, index, rank in (("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)):
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}}))
        hook = ttf.KerasHook(out_dir=str(tmp_path / f"run{rank}"), include_workers=include_workers)
        assert (hook.rank, hook.world_size, hook.worker) == (rank, 3, f"worker_{rank}")
        assert hook.writes == (include_workers == "all" or rank == 0)
        assert hook.num_workers == (3 if include_workers == "all" else 1)
        hook.close()
