"""Finite input that overflows float64 is refused with a ValueError naming the argument, in the
readable tier and in the compiled one alike: never a silent inf or NaN."""
import math
import warnings

import numpy as np
import pytest

from ppo_ref.spec import distributions as D
from ppo_ref.spec import losses as L

BIG = 1.7e308


def _refuses(fn, *names):
    """``fn()`` raises ValueError whose message names each of ``names``, without a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a RuntimeWarning from NumPy is not an answer
        with pytest.raises(ValueError) as info:
            fn()
    for name in names:
        assert name in str(info.value), (name, str(info.value))
    assert "\n" not in str(info.value)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# losses

@pytest.mark.parametrize("values, returns, old_values, clip", [
    ([1e300], [0.0], None, None),                       # (V - R)^2 overflows
    ([-1e300], [1e300], None, None),
    ([BIG], [-BIG], None, None),                        # V - R itself overflows
    ([1e154, 1e154, 1e154], [0.0, 0.0, 0.0], None, None),  # each term finite, the sum not
    ([1e300], [-1e300], [0.0], 0.2),                    # clipped ("max" mode)
])
def test_value_loss_overflow_is_refused(values, returns, old_values, clip):
    _refuses(lambda: L.value_loss(np.array(values), None if old_values is None
                                  else np.array(old_values), np.array(returns), clip), "values")


def test_value_loss_float32_gradient_overflow_is_refused():
    v = np.array([3e38], dtype=np.float32)
    _refuses(lambda: L.value_loss(v, None, np.array([-3e38], dtype=np.float32)), "values")


@pytest.mark.parametrize("old, new", [
    ([-709.0] * 3, [0.0] * 3),        # exp(709) each: the sum overflows
    ([0.0, 0.0], [800.0, 0.0]),       # exp overflows
    ([BIG], [-BIG]),                  # new - old overflows
    ([1e308, 1e308], [0.0, 0.0]),     # each term ~ 1e308, the sum overflows
])
@pytest.mark.parametrize("estimator", ["k3", "k1", "k2"])
def test_approx_kl_overflow_is_refused(old, new, estimator):
    finite_there = {"k1": max(old) < 1e300,  # k1 = mean(old - new)
                    "k2": max(map(abs, old + new)) < 1e3}  # k2 = mean((new - old)^2 / 2)
    if finite_there.get(estimator, False):
        assert math.isfinite(L.approx_kl(np.array(old), np.array(new), estimator))
        return
    _refuses(lambda: L.approx_kl(np.array(old), np.array(new), estimator), "new_log_probs",
             "old_log_probs")


def test_approx_kl_near_the_bound_is_finite():
    assert math.isfinite(L.approx_kl(np.zeros(1), np.array([-709.0])))
    assert math.isfinite(L.approx_kl(np.zeros(1), np.array([709.0])))


@pytest.mark.parametrize("new, old, adv", [
    ([0.0, 0.0], [0.0, 0.0], [BIG, BIG]),        # the surrogate sum overflows
    ([-BIG], [BIG], [1.0]),                       # the log-ratio overflows (to -inf)
    ([0.0, 0.0], [1e308, 1e308], [1.0, 1.0]),   # k3 of the info overflows (in the sum)
])
def test_policy_loss_overflow_is_refused(new, old, adv):
    msg = _refuses(lambda: L.policy_loss(np.array(new), np.array(old), np.array(adv), 0.2))
    assert "advantages" in msg or "new_log_probs" in msg


def test_entropy_loss_overflow_is_refused():
    _refuses(lambda: L.entropy_loss(np.array([-BIG, -BIG])), "entropy")


@pytest.mark.parametrize("y_pred, y_true", [
    ([1e300, -1e300], [-1e300, 1e300]),
    ([0.0, 0.0], [-1e300, 1e300]),
    ([BIG, -BIG], [0.0, 1.0]),
])
def test_explained_variance_overflow_is_refused(y_pred, y_true):
    msg = _refuses(lambda: L.explained_variance(np.array(y_pred), np.array(y_true)))
    assert "y_true" in msg or "y_pred" in msg


# --------------------------------------------------------------------------------------------
# distributions

@pytest.mark.parametrize("logits", [[BIG, -BIG], [[0.0, 1.0], [-BIG, BIG]], [1e308, -1e308, 0.0]])
@pytest.mark.parametrize("fn", ["log_softmax", "categorical_entropy", "categorical_log_prob",
                                "categorical_sample", "categorical_log_prob_backward",
                                "categorical_entropy_backward"])
def test_categorical_logits_whose_shift_overflows_are_refused(logits, fn):
    z = np.array(logits)
    batch = z.shape[:-1]
    a = np.zeros(batch, dtype=np.int64)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    calls = {
        "log_softmax": lambda: D.log_softmax(z),
        "categorical_entropy": lambda: D.categorical_entropy(z),
        "categorical_log_prob": lambda: D.categorical_log_prob(z, a),
        "categorical_sample": lambda: D.categorical_sample(rng, z),
        "categorical_log_prob_backward": lambda: D.categorical_log_prob_backward(
            z, a, np.ones(batch)),
        "categorical_entropy_backward": lambda: D.categorical_entropy_backward(z, np.ones(batch)),
    }
    _refuses(calls[fn], "logits")
    assert rng.bit_generator.state == state  # nothing drawn


def test_huge_logits_of_one_sign_and_masks_are_still_accepted():
    np.testing.assert_allclose(D.log_softmax(np.array([-BIG, -BIG])), [-math.log(2)] * 2)
    np.testing.assert_array_equal(D.log_softmax(np.array([1e308, 0.0])), [0.0, -1e308])
    out = D.log_softmax(np.array([1e308, -np.inf, 0.0]))
    assert out[1] == -np.inf and out[0] == 0.0 and out[2] == -1e308


def test_multi_categorical_component_whose_shift_overflows_is_refused():
    z = np.array([0.0, 1.0, BIG, -BIG])
    _refuses(lambda: D.multi_categorical_log_prob(z, np.array([0, 0]), [2, 2]), "logits")


@pytest.mark.parametrize("log_std, mean, actions", [
    ([-800.0], [[0.0]], [[1.0]]),     # exp(log_std) underflows to 0: a division by zero
    ([-800.0], [[0.0]], [[0.0]]),     # 0 / 0
    ([-400.0], [[0.0]], [[1.0]]),     # u = e^400 is finite, u^2 overflows
    ([0.0], [[-1e308]], [[1e308]]),   # actions - mean overflows
    ([BIG, BIG], [[0.0, 0.0]], [[0.0, 0.0]]),  # the sum of log_std overflows
])
def test_gaussian_log_prob_overflow_is_refused(log_std, mean, actions):
    ls, mu, a = np.array(log_std), np.array(mean), np.array(actions)
    msg = _refuses(lambda: D.gaussian_log_prob(mu, ls, a))
    assert "log_std" in msg or "actions" in msg
    if ls[0] < 0.0 or mu[0, 0] != 0.0:  # (a huge log_std has a finite gradient)
        msg = _refuses(lambda: D.gaussian_log_prob_backward(mu, ls, a, np.ones(1)))
        assert "log_std" in msg or "actions" in msg


def test_gaussian_log_prob_with_extreme_but_representable_scale_is_finite():
    assert math.isfinite(D.gaussian_log_prob(np.zeros((1, 1)), np.array([-300.0]),
                                             np.ones((1, 1)))[0])
    assert math.isfinite(D.gaussian_log_prob(np.zeros((1, 1)), np.array([710.0]),
                                             np.ones((1, 1)))[0])


def test_gaussian_sample_overflow_is_refused_before_drawing():
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    _refuses(lambda: D.gaussian_sample(rng, np.zeros((1, 1)), np.array([710.0])), "log_std")
    assert rng.bit_generator.state == state


def test_gaussian_sample_whose_sum_overflows_is_refused():
    rng = np.random.default_rng(0)
    _refuses(lambda: D.gaussian_sample(rng, np.full((8, 1), BIG), np.array([709.0])), "mean")


def test_gaussian_entropy_overflow_is_refused():
    _refuses(lambda: D.gaussian_entropy(np.array([BIG, BIG]), 2), "log_std")
    _refuses(lambda: D.gaussian_entropy_backward(np.zeros(1), np.array([BIG, BIG])),
             "d_entropy")


# --------------------------------------------------------------------------------------------
# the compiled tier refuses the same input with the same error class

def _overflowing_logits_params(policy, dict_params):
    """The policy's parameters with a policy head giving logits ``[1.7e308, -1.7e308]``."""
    arrays = {k: np.array(v, dtype=np.float64) for k, v in dict_params.items()}
    w_key = max(k for k in arrays if k.startswith("pi.w"))
    b_key = "pi.b" + w_key[len("pi.w"):]
    arrays[w_key][:] = 0.0
    arrays[b_key][:] = [BIG, -BIG]
    return arrays


def _refused_by_the_tier(tier, fn, *names):
    """The readable tier refuses with a ValueError naming ``names`` (no warning); the compiled
    tier with one FloatingPointError naming the compiled function (or a ValueError of the spec
    code it runs under): never a silent inf or NaN."""
    if tier == "spec":
        return _refuses(fn, *names)
    with pytest.raises((FloatingPointError, ValueError)) as info:
        fn()
    if info.type is FloatingPointError:
        assert str(info.value).startswith("ppo_ref.fast.") and "non-finite" in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("tier", ["fast", "spec"])
def test_mlp_policy_overflowing_logits_are_refused_in_both_tiers(tier):
    import gymnasium as gym
    from ppo_ref.config import PPOConfig
    from ppo_ref.tiers import tier_for
    from ppo_ref.train.policies import MLPPolicy
    policy = MLPPolicy(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
                       PPOConfig(net_arch=(4,), backend=tier), tier_for(tier))
    params = _overflowing_logits_params(policy, policy.init_params(np.random.default_rng(0)))
    obs = np.zeros((3, 2))
    _refused_by_the_tier(tier, lambda: policy.evaluate(params, (obs, np.zeros(3, np.int64))),
                         "logits")


@pytest.mark.parametrize("tier", ["fast", "spec"])
def test_recurrent_policy_overflowing_logits_are_refused_in_both_tiers(tier):
    policy = _recurrent_policy(tier, obs_dim=2)
    params = _overflowing_logits_params(policy, policy.init_params(np.random.default_rng(0)))
    T, N = 2, 1
    data = (np.zeros((T, N, 2)), np.zeros((T, N), dtype=np.int64), policy.initial_state(N),
            np.zeros((T, N), dtype=bool))
    _refused_by_the_tier(tier, lambda: policy.evaluate(params, data), "logits")


def _minibatch(n=4, **override):
    a = dict(new_log_probs=np.zeros(n), entropy=np.ones(n), values=np.zeros(n),
             old_log_probs=np.zeros(n), advantages=np.ones(n), returns=np.zeros(n),
             old_values=np.zeros(n))
    a.update({k: np.asarray(v, dtype=np.float64) for k, v in override.items()})
    return a


@pytest.mark.parametrize("override, cfg", [
    (dict(values=[1e300] * 4), {}),
    (dict(values=[1e154] * 4), {}),
    (dict(values=[1e300] * 4, old_values=[0.0] * 4), dict(clip_range_vf=0.2)),
    (dict(entropy=[-BIG] * 4), dict(ent_coef=0.01)),
    (dict(old_log_probs=[1e308] * 4), {}),
    (dict(old_log_probs=[1e308] * 4), dict(kl_estimator="k1")),
    (dict(new_log_probs=[-BIG] * 4, old_log_probs=[BIG] * 4), {}),
    (dict(advantages=[BIG] * 4), dict(normalize_advantage=False)),
    (dict(values=[1e153] * 4), dict(vf_coef=1e200)),  # every part finite, the total not
])
@pytest.mark.parametrize("tier", ["spec", "fast"])
def test_minibatch_loss_refuses_an_overflow_on_both_tiers(override, cfg, tier):
    """The update's minibatch loss (spec code) with the tier's losses: the readable tier names
    the cause; the compiled tier raises its one error (the spec's own total check when every
    part is finite)."""
    from ppo_ref.config import PPOConfig
    from ppo_ref.spec.update import minibatch_loss
    from ppo_ref.tiers import tier_for
    losses = tier_for(tier).losses
    msg = _refused_by_the_tier(tier, lambda: minibatch_loss(
        **_minibatch(**override), config=PPOConfig(**cfg), clip_range=0.2, losses=losses))
    if "vf_coef" in cfg:  # the total's check is spec code under both tiers
        assert msg.startswith("the total loss")


def test_categorical_functions_refuse_logits_whose_shift_overflows():
    """The spec's sampling loop refuses a row whose shift overflows (the spec sampler names
    the logits); the compiled twins raise their one error on it."""
    from ppo_ref.fast import distributions as fast
    z = np.array([[0.0, 1.0], [BIG, -BIG]])
    actions = np.zeros(2, dtype=np.int64)
    with pytest.raises(FloatingPointError):
        fast.categorical_log_prob(z, actions)
    with pytest.raises(FloatingPointError):
        fast.categorical_sample(np.random.default_rng(0), z)
    _refuses(lambda: D.categorical_sample(np.random.default_rng(0), z), "logits")
    with np.errstate(over="ignore"):  # the interpreted loop's scalar subtraction warns
        assert not D.inverse_cdf_actions(z, np.full(2, 0.5), actions.copy())
    ok = np.array([[0.0, 1.0], [1e308, -np.inf]])  # a mask beside a huge logit is fine
    assert D.inverse_cdf_actions(ok, np.full(2, 0.5), actions)
    np.testing.assert_array_equal(fast.categorical_sample(np.random.default_rng(0), ok),
                                  D.categorical_sample(np.random.default_rng(0), ok))


# --------------------------------------------------------------------------------------------
# the spec layers and networks refuse NaN or inf parameters, naming the key

def _spoiled(params, key, bad, index=0):
    out = {k: np.array(v, dtype=np.float64) for k, v in params.items()}
    out[key].reshape(-1)[index] = bad
    return out


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("which", ["linear_forward", "linear_backward", "mlp_forward",
                                   "mlp_backward"])
def test_spec_layers_refuse_non_finite_parameters(which, bad):
    from ppo_ref.spec import layers
    rng = np.random.default_rng(0)
    x = np.ones((2, 3))
    if which.startswith("linear"):
        params = layers.linear_init(rng, 3, 2, 1.0)
        key = "w"
    else:
        params = layers.mlp_init(rng, 3, [4], 2)
        key = "b0"
    y, cache = getattr(layers, which.replace("backward", "forward"))(params, x)
    spoiled = _spoiled(params, key, bad, index=1)
    with pytest.raises(ValueError, match=rf"params\['{key}'\] must be finite"):
        if which.endswith("forward"):
            getattr(layers, which)(spoiled, x)
        else:
            getattr(layers, which)(spoiled, cache, np.ones_like(y))


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("which", ["actor_critic_forward", "value_forward",
                                   "actor_critic_backward"])
def test_spec_actor_critic_refuses_non_finite_parameters(which, shared_trunk):
    from ppo_ref.spec import networks as nets
    params = nets.actor_critic_init(np.random.default_rng(0), 3, 2, net_arch=(4,),
                                    shared_trunk=shared_trunk)
    obs = np.ones((2, 3))
    key = "vf.w1" if not shared_trunk else "vf.w0"
    spoiled = _spoiled(params, key, np.nan)
    with pytest.raises(ValueError, match=rf"params\['{key}'\] must be finite"):
        if which == "actor_critic_forward":
            nets.actor_critic_forward(spoiled, obs, shared_trunk=shared_trunk)
        elif which == "value_forward":
            nets.value_forward(spoiled, obs, shared_trunk=shared_trunk)
        else:
            out, values, cache = nets.actor_critic_forward(params, obs, shared_trunk=shared_trunk)
            nets.actor_critic_backward(spoiled, cache, np.ones_like(out), np.ones_like(values))


@pytest.mark.parametrize("which", ["lstm_forward", "step_forward", "lstm_step"])
def test_spec_lstm_refuses_non_finite_parameters(which):
    from ppo_ref.spec import lstm
    params = lstm.lstm_init(np.random.default_rng(0), 3, 4)
    spoiled = _spoiled(params, "w_hh", np.inf)
    h = np.zeros((2, 4))
    with pytest.raises(ValueError, match=r"params\['w_hh'\] must be finite"):
        if which == "lstm_forward":
            lstm.lstm_forward(spoiled, np.ones((5, 2, 3)), h, h, np.zeros((5, 2), bool))
        else:
            getattr(lstm, which)(spoiled, np.ones((2, 3)), h, h, np.zeros(2, bool))


@pytest.mark.parametrize("key", ["lstm_pi.w_ih", "pi.w0", "vf.b1"])
def test_spec_recurrent_network_names_the_non_finite_parameter(key):
    from ppo_ref.spec import recurrent_networks as rn
    params = rn.recurrent_actor_critic_init(np.random.default_rng(0), 3, 2, hidden_size=4,
                                            net_arch=(5,))
    spoiled = _spoiled(params, key, np.inf)
    state = rn.initial_lstm_states(params, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match=rf"params\['{key}'\] must be finite"):
            rn.recurrent_actor_critic_forward(spoiled, np.ones((3, 2, 3)), state,
                                              np.zeros((3, 2), bool))
        with pytest.raises(ValueError, match=rf"params\['{key}'\] must be finite"):
            rn.recurrent_actor_critic_step(spoiled, np.ones((2, 3)), state, np.zeros(2, bool))


# --------------------------------------------------------------------------------------------
# recurrent functions name the public argument; counts are integers

@pytest.mark.parametrize("n_envs", [1.5, True, "2", 0])
def test_initial_lstm_states_refuses_non_integer_counts(n_envs):
    from ppo_ref.spec import recurrent_networks as rn
    params = rn.recurrent_actor_critic_init(np.random.default_rng(0), 3, 2, hidden_size=4,
                                            net_arch=(5,))
    _refuses(lambda: rn.initial_lstm_states(params, n_envs), "n_envs")


def _recurrent_policy(tier, obs_dim=3):
    import gymnasium as gym
    from ppo_ref.config import PPOConfig
    from ppo_ref.tiers import tier_for
    from ppo_ref.train.policies import RecurrentPolicy
    return RecurrentPolicy(gym.spaces.Box(-1, 1, (obs_dim,)), gym.spaces.Discrete(2),
                           PPOConfig(net_arch=(5,), lstm_hidden_size=4, backend=tier),
                           tier_for(tier))


@pytest.mark.parametrize("n_envs", [1.5, True, np.float64(2.0), 0, "2"])
def test_recurrent_trainer_initial_state_refuses_non_integer_counts(n_envs):
    from ppo_ref.config import PPOConfig
    from ppo_ref.train.recurrent_ppo import RecurrentPPOTrainer
    trainer = RecurrentPPOTrainer("ppo_ref/MemoryCue-v0", PPOConfig(
        n_envs=1, n_steps=8, batch_size=8, net_arch=(), lstm_hidden_size=4), seed=0)
    try:
        _refuses(lambda: trainer.initial_state(n_envs), "n_envs")
        assert trainer.initial_state(np.int64(3)).h.shape == (2, 3, 4)
    finally:
        trainer.close()


@pytest.mark.parametrize("tier", ["fast", "spec"])
@pytest.mark.parametrize("bad", ["d_log_probs", "d_entropy", "d_values"])
def test_recurrent_policy_backward_refuses_a_gradient_of_the_wrong_shape(tier, bad):
    """Never a silent broadcast: a gradient of the wrong shape is a ValueError; the readable
    tier's head names it (the values' gradient is reshaped to [T, n] first: NumPy names it)."""
    policy = _recurrent_policy(tier)
    params = policy.init_params(np.random.default_rng(0))
    T, N = 2, 2
    cache = policy.evaluate(params, (np.zeros((T, N, 3)), np.zeros((T, N), dtype=np.int64),
                                     policy.initial_state(N), np.zeros((T, N), bool)))[3]
    grads = {"d_log_probs": np.zeros(T * N), "d_entropy": np.zeros(T * N),
             "d_values": np.zeros(T * N)}
    grads[bad] = np.zeros(T * (N + 1))
    with pytest.raises(ValueError) as info:
        policy.backward(params, cache, **grads)
    if tier == "spec" and bad != "d_values":
        assert bad in str(info.value)
