"""update.minibatch_loss (one call of the compiled kernel) gives exactly the results of
spec.update.minibatch_loss, raises its errors, and converts its inputs explicitly."""
import numpy as np
import pytest

from ppo_ref.fast import update
from ppo_ref.config import PPOConfig
from ppo_ref.spec import update as spec

CONFIGS = [
    PPOConfig.zoo_cartpole(),
    PPOConfig(ent_coef=0.01, clip_range_vf=0.2, kl_estimator="k1"),
    PPOConfig(clip_range_vf=0.1, value_loss_mode="sb3", normalize_advantage=False),
    PPOConfig(advantage_norm_ddof=0, value_loss_scale=0.5),
]


def inputs(rng, n=64, shape=None):
    args = [rng.standard_normal(n) for _ in range(7)]
    args[0] = args[3] + 0.3 * rng.standard_normal(n)  # new log-probs near the old ones
    return [a.reshape(shape) for a in args] if shape else args


def assert_same(fast, slow):
    for name in slow._fields:
        a, b = getattr(fast, name), getattr(slow, name)
        if b is None:
            assert a is None, name
        elif isinstance(b, float) and np.isnan(b):
            assert np.isnan(a), name
        else:
            assert np.array_equal(a, b), name
            assert np.shape(a) == np.shape(b), name


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("clip_range", [0.2, 0.0])
@pytest.mark.parametrize("n", [1, 64, 1000])  # 1000: numpy's pairwise sums use several blocks
@pytest.mark.parametrize("with_log_ratio", [True, False])
def test_fast_loss_equals_spec_loss_bit_for_bit(rng, config, clip_range, n, with_log_ratio):
    args = inputs(rng, n)
    kw = dict(config=config, clip_range=clip_range, with_log_ratio=with_log_ratio)
    assert_same(update.minibatch_loss(*args, **kw), spec.minibatch_loss(*args, **kw))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(8, 8), (4, 16)])
def test_fast_loss_equals_spec_loss_for_2d_minibatches(rng, config, shape):
    args = inputs(rng, 64, shape)
    kw = dict(config=config, clip_range=0.2)
    assert_same(update.minibatch_loss(*args, **kw), spec.minibatch_loss(*args, **kw))


def test_fast_loss_converts_its_inputs_explicitly(rng):
    """float32, Fortran-ordered or strided inputs are converted to C-contiguous float64: the
    results of the same numbers given as float64."""
    config = CONFIGS[1]
    args = inputs(rng, 64, (8, 8))
    want = update.minibatch_loss(*args, config=config, clip_range=0.2)
    fortran = [np.asfortranarray(a) for a in args]
    assert_same(update.minibatch_loss(*fortran, config=config, clip_range=0.2), want)
    strided = [np.repeat(a, 2, axis=1)[:, ::2] for a in args]
    assert_same(update.minibatch_loss(*strided, config=config, clip_range=0.2), want)
    f32 = [a.astype(np.float32) for a in args]
    up = [a.astype(np.float64) for a in f32]
    assert_same(update.minibatch_loss(*f32, config=config, clip_range=0.2),
                update.minibatch_loss(*up, config=config, clip_range=0.2))


def test_fast_loss_raises_the_spec_errors(rng):
    config = PPOConfig()
    args = inputs(rng)
    names = ["new_log_probs", "entropy", "values", "old_log_probs", "advantages", "returns",
             "old_values"]
    for j, name in enumerate(names):
        bad = [a.copy() for a in args]
        bad[j][7] = np.nan
        with pytest.raises(ValueError, match=f"^{name} must be finite") as fast:
            update.minibatch_loss(*bad, config=config, clip_range=0.2)
        with pytest.raises(ValueError) as slow:
            spec.minibatch_loss(*bad, config=config, clip_range=0.2)
        assert str(fast.value) == str(slow.value)
    far = [a.copy() for a in args]
    far[0][3] = far[3][3] + 800.0  # exp overflows float64
    with pytest.raises(ValueError, match="^new_log_probs - old_log_probs.*index \\(3,\\)"):
        update.minibatch_loss(*far, config=config, clip_range=0.2)
    with pytest.raises(ValueError, match="^new_log_probs - old_log_probs.*index \\(3,\\)"):
        spec.minibatch_loss(*far, config=config, clip_range=0.2)
    with pytest.raises(ValueError, match="^old_values must have the shape"):
        update.minibatch_loss(*args[:6], args[6][:10], config=config, clip_range=0.2)
    with pytest.raises(ValueError, match="^clip_range"):
        update.minibatch_loss(*args, config=config, clip_range=-0.1)
    with pytest.raises(ValueError, match="must not be empty"):
        update.minibatch_loss(*[a[:0] for a in args], config=config, clip_range=0.2)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(64,), (8, 8)])
def test_fast_weighted_loss_equals_spec_loss_bit_for_bit(rng, config, shape):
    """Per-row weights (a 0/1 mask with some halves): the compiled weighted entropy sum and its
    gradient -w / sum(w) are the spec's entropy_loss bits, with and without an entropy bonus."""
    args = inputs(rng, 64, shape if len(shape) > 1 else None)
    weights = ((rng.random(64) < 0.7) * rng.choice([1.0, 0.5], 64)).reshape(shape)
    weights.flat[0] = 1.0
    for ent_coef in (0.0, 0.01):
        kw = dict(config=PPOConfig(**{**vars(config), "ent_coef": ent_coef}), clip_range=0.2,
                  weights=weights)
        assert_same(update.minibatch_loss(*args, **kw), spec.minibatch_loss(*args, **kw))


@pytest.mark.parametrize("change, match", [
    (dict(advantage_norm_eps_placement="middle"), "placement"),
    (dict(value_loss_mode="l1"), "mode"),
])
def test_fast_update_raises_the_loss_setting_errors_of_the_first_minibatch(rng, change, match):
    """run_epochs checks the loss settings once, where minibatch_loss checks them: a bad
    setting raises minibatch_loss's own error at the first minibatch, after its evaluate."""
    from ppo_ref.fast.flat import flatten_arrays
    config = object.__new__(PPOConfig)  # a config that skips PPOConfig's own validation
    config.__dict__.update({**vars(PPOConfig()), **change})
    args = inputs(rng, 16)
    params = flatten_arrays({"w": np.ones(3)})
    evaluated = []

    def evaluate(p, data):
        evaluated.append(data)
        return args[0], args[1], args[2], None
    mb = update.Minibatch(args[3], args[4], args[5], args[6], "data")
    with pytest.raises(ValueError) as fast:
        update.run_epochs(params, {"t": 0, "m": {"w": np.zeros(3)}, "v": {"w": np.zeros(3)}},
                          config=config, lr=1e-3, clip_range=0.2, minibatches=lambda e: [mb],
                          evaluate=evaluate, backward=None)
    with pytest.raises(ValueError, match=match) as direct:
        update.minibatch_loss(*args, config=config, clip_range=0.2)
    assert str(fast.value) == str(direct.value) and evaluated == ["data"]
