"""update.minibatch_loss: the direct-kernel path gives exactly the results of the checked
path through the public loss functions, and falls back to it (and its errors) otherwise."""
import numpy as np
import pytest

from ppo_ref import update
from ppo_ref.config import PPOConfig

CONFIGS = [
    PPOConfig.zoo_cartpole(),
    PPOConfig(ent_coef=0.01, clip_range_vf=0.2, kl_estimator="k1"),
    PPOConfig(clip_range_vf=0.1, value_loss_mode="sb3", normalize_advantage=False),
    PPOConfig(advantage_norm_ddof=0, value_loss_scale=0.5),
]


def inputs(rng, n=64):
    args = [rng.standard_normal(n) for _ in range(7)]
    args[0] = args[3] + 0.3 * rng.standard_normal(n)  # new log-probs near the old ones
    return args


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("clip_range", [0.2, 0.0])
@pytest.mark.parametrize("n", [64, 1000])  # 1000: numpy's pairwise sums use several blocks
def test_fast_loss_equals_checked_loss(rng, monkeypatch, config, clip_range, n):
    args = inputs(rng, n)
    fast = update._fast_minibatch_loss(*args, config, clip_range, True)
    assert fast is not None
    monkeypatch.setattr(update, "_fast_minibatch_loss", lambda *a: None)
    slow = update.minibatch_loss(*args, config=config, clip_range=clip_range)
    for name in slow._fields:
        a, b = getattr(fast, name), getattr(slow, name)
        if b is None:
            assert a is None, name
        else:
            assert np.array_equal(a, b), name


def test_fast_loss_declines_what_it_does_not_handle(rng):
    config = PPOConfig()
    args = inputs(rng)
    assert update._fast_minibatch_loss(*[a.astype(np.float32) for a in args], config, 0.2, True) is None
    assert update._fast_minibatch_loss(*[a[:1] for a in args], config, 0.2, True) is None
    bad = [a.copy() for a in args]
    bad[0][5] = np.nan
    assert update._fast_minibatch_loss(*bad, config, 0.2, True) is None
    with pytest.raises(ValueError, match="new_log_probs"):
        update.minibatch_loss(*bad, config=config, clip_range=0.2)
    far = [a.copy() for a in args]
    far[0][2] = far[3][2] + 800.0  # exp overflows: the checked path names it
    assert update._fast_minibatch_loss(*far, config, 0.2, True) is None
    with pytest.raises(ValueError, match="overflows"):
        update.minibatch_loss(*far, config=config, clip_range=0.2)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(16, 8), (40, 32)])  # the recurrent trainer's [T, n] minibatches
def test_fast_loss_equals_checked_loss_for_2d_minibatches(rng, monkeypatch, config, shape):
    args = [a.reshape(shape) for a in inputs(rng, int(np.prod(shape)))]
    fast = update._fast_minibatch_loss(*args, config, 0.2, True)
    assert fast is not None
    monkeypatch.setattr(update, "_fast_minibatch_loss", lambda *a: None)
    slow = update.minibatch_loss(*args, config=config, clip_range=0.2)
    for name in slow._fields:
        a, b = getattr(fast, name), getattr(slow, name)
        if b is None:
            assert a is None, name
        else:
            assert np.shape(a) == np.shape(b) and np.array_equal(a, b), name


def test_fast_loss_declines_mixed_shapes_and_layouts(rng):
    config = PPOConfig()
    args = [a.reshape(8, 8) for a in inputs(rng)]
    assert update._fast_minibatch_loss(*args[:6], args[6].reshape(64), config, 0.2, True) is None
    assert update._fast_minibatch_loss(*args[:6], np.asfortranarray(args[6].T).T.copy(order="F"),
                                       config, 0.2, True) is None
