"""Counts, byte order and missing observations are refused with a ValueError naming the argument."""
import numpy as np
import pytest

from ppo_ref._checks import as_float_array, check_count
from ppo_ref.config import PPOConfig
from ppo_ref.spec.layers import orthogonal
from ppo_ref.train.ppo import PPOTrainer


@pytest.mark.parametrize("value", [1.5, True, "3", None, np.float64(2.0), 2 ** 70 * 1.0,
                                   np.ones((20, 20))])
def test_check_count_refuses_non_integers(value):
    with pytest.raises(ValueError, match="n_things") as info:
        check_count(value, "n_things", 1)
    assert "\n" not in str(info.value)


def test_check_count_accepts_integers_and_enforces_the_minimum():
    assert check_count(np.int64(3), "n", 1) == 3 and type(check_count(np.int64(3), "n", 1)) is int
    with pytest.raises(ValueError, match="n must be >= 1, got 0"):
        check_count(0, "n", 1)


def test_big_endian_floats_are_converted_to_native_order():
    big = np.arange(4, dtype=">f8")
    out = as_float_array(big, "x")
    assert out.dtype == np.float64 and out.dtype.isnative
    np.testing.assert_array_equal(out, [0.0, 1.0, 2.0, 3.0])
    assert as_float_array(np.ones(2, dtype=">f4"), "x").dtype == np.float32


@pytest.mark.parametrize("shape", [(2.5, 3), (2, True), ("2", 3)])
def test_orthogonal_refuses_non_integer_dimensions(shape):
    with pytest.raises(ValueError, match="shape"):
        orthogonal(np.random.default_rng(0), shape)


@pytest.fixture(scope="module")
def trainer():
    t = PPOTrainer("CartPole-v1", PPOConfig(n_envs=1, n_steps=16, batch_size=16), seed=0)
    yield t
    t.close()


@pytest.mark.parametrize("n_episodes", [1.5, True, "2"])
def test_evaluate_refuses_non_integer_episode_counts(trainer, n_episodes):
    with pytest.raises(ValueError, match="n_episodes"):
        trainer.evaluate(n_episodes)


@pytest.mark.parametrize("obs", [None, "abc", [[1.0, 2.0, 3.0]], np.full(4, np.nan)])
def test_predict_refuses_missing_or_malformed_observations(trainer, obs):
    with pytest.raises(ValueError, match="obs"):
        trainer.predict(obs)


def test_predict_still_takes_one_observation_and_a_batch(trainer):
    assert np.shape(trainer.predict(np.zeros(4), deterministic=True)) == ()
    assert trainer.predict(np.zeros((3, 4)), deterministic=True).shape == (3,)


@pytest.mark.parametrize("value", [np.zeros((3, 2)), [1.0, 2.0], np.full((40, 40), 1e308)])
def test_scalar_checks_name_non_scalars_on_one_line(value):
    from ppo_ref._checks import check_real_scalar
    with pytest.raises(ValueError) as info:
        check_real_scalar(value, "gain")
    assert "\n" not in str(info.value) and str(info.value).startswith("gain must be a real number")


@pytest.mark.parametrize("field", ["gamma", "n_steps", "normalize_observations", "clip_range"])
def test_config_errors_for_arrays_are_one_line(field):
    with pytest.raises(ValueError) as info:
        PPOConfig(**{field: np.full((30, 30), 0.5)})
    assert "\n" not in str(info.value) and str(info.value).startswith(field)


def test_evaluate_refuses_a_negative_or_non_integer_seed():
    """Found by validation/fault_campaign.py: a negative seed reached gymnasium's own error."""
    trainer = PPOTrainer("CartPole-v1", PPOConfig(n_steps=8, batch_size=8), seed=0)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="^seed must be"):
            trainer.evaluate(1, seed=bad)
    trainer.close()
