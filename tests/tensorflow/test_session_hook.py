"""SessionHook on TF1-style graph code (tf.compat.v1 MonitoredTrainingSession), in a subprocess: graph mode
(`disable_eager_execution`) is process-wide and would change every other test of this process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tensortap as tt

pytest.importorskip("tensorflow")

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import tensorflow as tf
    import tensortap.tensorflow as ttf
    tf.compat.v1.disable_eager_execution()
    OUT = sys.argv[1]
    tf.compat.v1.set_random_seed(0)
    x = tf.compat.v1.placeholder(tf.float32, [None, 4])
    y = tf.compat.v1.placeholder(tf.int64, [None])

    def dense(t, units, name):  # (tf.compat.v1.layers needs Keras 2)
        with tf.compat.v1.variable_scope(name):
            k = tf.compat.v1.get_variable("kernel", [t.shape[-1], units])
            b = tf.compat.v1.get_variable("bias", [units], initializer=tf.compat.v1.zeros_initializer())
        return tf.matmul(t, k) + b

    h = tf.nn.relu(dense(x, 8, "d1"))
    logits = dense(h, 3, "d2")
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(y, logits)
    fetched = []  # how often the graph computed the tensor given to add_to_collection

    def count(t):
        fetched.append(1)
        return t

    watched = tf.identity(tf.py_function(count, [tf.reduce_mean(h)], tf.float32), name="watched")
    hook = ttf.SessionHook(out_dir=OUT, save_config=ttf.SaveConfig(save_interval=2),
                           include_collections=["weights", "biases", "gradients", "losses", "custom"])
    hook.add_to_collection("custom", watched)
    FAIL = len(sys.argv) > 2 and sys.argv[2] == "fail"
    if FAIL:
        def boom(*args, **kwargs):
            raise RuntimeError("injected failure")
        hook.write_tensors = boom
    opt = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    grads_and_vars = opt.compute_gradients(loss)
    train = opt.apply_gradients(grads_and_vars, global_step=tf.compat.v1.train.get_or_create_global_step())
    grads = [g for g, _v in grads_and_vars]
    variables = [v for _g, v in grads_and_vars]
    rng = np.random.default_rng(0)
    seen = {"w": [], "g": [], "loss": [], "eval_loss": []}
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        for step in range(5):
            feed = {x: rng.normal(size=(16, 4)).astype("float32"), y: rng.integers(0, 3, 16)}
            # the weights before the step, read without the hooks (not a step)
            seen["w"].append(sess.run_step_fn(lambda step_context: step_context.session.run(variables)))
            _, l, g = sess.run([train, loss, grads], feed_dict=feed)
            seen["loss"].append(l); seen["g"].append(g)
        hook.set_mode(ttf.modes.EVAL)
        for step in range(3):
            feed = {x: rng.normal(size=(16, 4)).astype("float32"), y: rng.integers(0, 3, 16)}
            seen["eval_loss"].append(sess.run(loss, feed_dict=feed))
    hook.close()
    if FAIL:  # the first saving step failed: logged, hook off, all 8 runs done
        assert hook.error_count == 1 and hook.disabled and len(seen["loss"]) == 5 and len(seen["eval_loss"]) == 3
        print("TRAINING_DONE"); sys.exit(0)
    assert hook.error_count == 0, hook.first_error
    names = [v.op.name for v in variables]
    np.savez(OUT + "_ref.npz", names=np.array(names), fetched=len(fetched),
             loss=np.array(seen["loss"]), eval_loss=np.array(seen["eval_loss"]),
             **{f"w{s}_{i}": a for s, ws in enumerate(seen["w"]) for i, a in enumerate(ws)},
             **{f"g{s}_{i}": a for s, gs in enumerate(seen["g"]) for i, a in enumerate(gs)})
    """
)


def test_session_hook_saves_what_the_session_computes(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = str(tmp_path / "run")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, str(script), out], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = np.load(out + "_ref.npz")
    names = [str(n) for n in ref["names"]]
    assert names == ["d1/kernel", "d1/bias", "d2/kernel", "d2/bias"]

    tr = tt.create_trial(out)
    train, ev = tt.modes.TRAIN, tt.modes.EVAL
    assert tr.steps(mode=train) == [0, 2, 4]
    assert tr.steps(mode=ev) == [0, 1, 2]  # the loss is saved at every EVAL step
    assert set(tr.tensor_names(collection="weights")) == {"weights/d1/kernel", "weights/d2/kernel"}
    assert set(tr.tensor_names(collection="biases")) == {"weights/d1/bias", "weights/d2/bias"}
    for s in (0, 2, 4):
        for i, n in enumerate(names):
            assert np.array_equal(tr.tensor(f"weights/{n}").value(s, mode=train), ref[f"w{s}_{i}"]), (n, s)
            assert np.array_equal(tr.tensor(f"gradients/{n}Grad").value(s, mode=train), ref[f"g{s}_{i}"]), (n, s)
        assert tr.tensor("loss").value(s, mode=train) == ref["loss"][s]
    for s in (0, 1, 2):
        assert tr.tensor("loss").value(s, mode=ev) == ref["eval_loss"][s]
    assert tr.tensor("gradients/d1/kernelGrad").steps(mode=ev) == []
    # the collection's tensor was computed on the saving steps only (3 TRAIN + 2 EVAL), never on the others
    assert tr.tensor("watched").steps(mode=train) == [0, 2, 4]
    assert int(ref["fetched"]) == 5


def test_injected_failure_turns_the_hook_off_and_training_goes_on(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "run"), "fail"], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "TRAINING_DONE" in r.stdout
    assert "injected failure" in r.stderr
