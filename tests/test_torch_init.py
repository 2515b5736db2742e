"""``ortho_init=False``: torch's own initialization of nn.Linear and nn.LSTM (SB3's
``ortho_init=False``, sb3-contrib's LSTM), in place of the orthogonal one."""
import math

import numpy as np
import pytest

from ppo_ref import PPOConfig, PPOTrainer, RecurrentPPOTrainer
from ppo_ref.spec.layers import torch_linear_init
from ppo_ref.spec.lstm import lstm_init
from ppo_ref.spec.networks import actor_critic_init
from ppo_ref.spec.recurrent_networks import recurrent_actor_critic_init


def test_the_bound_is_torchs():
    """torch.nn.Linear's kaiming_uniform_(a=sqrt(5)) bound on the weights and its bias bound are
    both 1 / sqrt(fan_in), the bound torch_linear_init draws within."""
    torch = pytest.importorskip("torch")
    for fan_in in (1, 4, 64, 257):
        gain = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
        assert gain * math.sqrt(3.0 / fan_in) == pytest.approx(1.0 / math.sqrt(fan_in))
        layer = torch.nn.Linear(fan_in, 3000)
        k = 1.0 / math.sqrt(fan_in)
        assert float(layer.weight.detach().abs().max()) <= k
        ours = torch_linear_init(np.random.default_rng(0), fan_in, 3000)
        for name, theirs in (("w", layer.weight), ("b", layer.bias)):
            ours_max, theirs_max = np.abs(ours[name]).max(), float(theirs.detach().abs().max())
            assert ours_max <= k and ours_max > 0.99 * k and theirs_max > 0.99 * k


def test_torch_linear_init_is_uniform_within_the_bound():
    p = torch_linear_init(np.random.default_rng(1), 16, 20_000)
    k = 0.25
    for a in (p["w"], p["b"]):
        assert np.all(np.abs(a) <= k)
        # U(-k, k): mean 0, variance k^2 / 3 (a few standard errors of slack)
        assert abs(a.mean()) < 5 * k / math.sqrt(3 * a.size)
        assert a.var() == pytest.approx(k * k / 3, rel=0.05 if a.ndim == 1 else 0.01)


@pytest.mark.parametrize("shared_trunk", [False, True])
def test_actor_critic_torch_init_has_the_orthogonal_layout_and_torch_bounds(shared_trunk):
    ortho = actor_critic_init(np.random.default_rng(0), 4, 2, shared_trunk=shared_trunk)
    torch_like = actor_critic_init(np.random.default_rng(0), 4, 2, shared_trunk=shared_trunk,
                                   ortho_init=False)
    assert list(torch_like) == list(ortho)
    for key, value in torch_like.items():
        assert value.shape == ortho[key].shape
        fan_in = torch_like[key.replace(".b", ".w")].shape[1]
        assert np.all(np.abs(value) <= 1.0 / math.sqrt(fan_in))
        if ".b" in key:
            assert np.all(value != 0.0)  # orthogonal init leaves the biases at 0
    # the head gains do not apply: the policy head is not scaled down to 0.01
    assert np.abs(torch_like["pi.w0" if shared_trunk else "pi.w2"]).max() > 0.1


def test_lstm_torch_init_bounds_and_layout():
    h, d = 16, 3
    p = lstm_init(np.random.default_rng(0), d, h, ortho_init=False)
    q = lstm_init(np.random.default_rng(0), d, h)
    assert list(p) == list(q) and all(p[k].shape == q[k].shape for k in p)
    k = 1.0 / math.sqrt(h)
    assert np.abs(p["w_ih"]).max() <= k and np.abs(p["w_hh"]).max() <= k
    assert np.abs(p["b"]).max() <= 2 * k and np.abs(p["b"]).max() > k  # b_ih + b_hh
    params = recurrent_actor_critic_init(np.random.default_rng(0), d, 2, hidden_size=h,
                                         net_arch=(8,), ortho_init=False)
    assert np.abs(params["lstm_pi.w_hh"]).max() <= k
    assert np.all(params["pi.b0"] != 0.0)


@pytest.mark.parametrize("trainer, env", [(PPOTrainer, "CartPole-v1"),
                                          (RecurrentPPOTrainer, "ppo_ref/CartPoleNoVel-v1")])
def test_trainers_draw_the_torch_init_when_asked(trainer, env):
    config = PPOConfig(n_envs=2, n_steps=8, batch_size=16, lstm_hidden_size=8, net_arch=(8,),
                       ortho_init=False)
    params = trainer(env, config, seed=0).params
    default = trainer(env, config.replace(ortho_init=True), seed=0).params
    assert list(params) == list(default)
    assert np.all(params["pi.b0"] != 0.0) and np.all(default["pi.b0"] == 0.0)
    assert np.abs(params["pi.w1"]).max() <= 1.0 / math.sqrt(8)
