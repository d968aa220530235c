import numpy as np

from tensortap.rules.builtin import CheckInputImages


def images(mean):
    rng = np.random.default_rng(1)
    return lambda s: (rng.standard_normal((100, 3, 8, 8)) + mean).astype(np.float32)


def test_fires_on_unnormalised_images(job, run_rule):
    trial = job(8, {"hybridsequential0_input_0": ("inputs", images(np.array([0, 0.5, 0])[None, :, None, None]))})
    rep = run_rule(CheckInputImages(trial))
    assert rep.first_fired_step == 4  # 500 images after step 4
    assert rep.first_violations[0].condition.startswith("channel 1")


def test_channel_last_and_threshold_samples(job, run_rule):
    def img(s):
        return np.full((10, 4, 4, 3), 128.0, np.float32)

    trial = job(3, {"net_input_0": ("inputs", img)})
    rep = run_rule(CheckInputImages(trial, regex="net_input_0", channel="3", threshold_samples="20"))
    assert rep.first_fired_step == 1 and len(rep.first_violations) == 3


def test_quiet_on_normalised_images(job, run_rule):
    trial = job(8, {"hybridsequential0_input_0": ("inputs", images(0.0))})
    rep = run_rule(CheckInputImages(trial))
    assert not rep.triggered and rep.steps_evaluated == 8
