"""Cross-check of the readable tier against PyTorch: the MLP actor-critic
(ppo_ref.spec.networks), the distributions, orthogonal init, Adam (ppo_ref.spec.optim).

Skipped when torch is not installed. Weights are copied from ppo_ref into torch modules
(torch's ``nn.Linear`` has the same ``[out, in]`` layout), everything runs in float64, and the
forward values and every gradient (torch autograd vs ppo_ref's manual backward) must agree to
1e-10.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ppo_ref.spec.distributions import (  # noqa: E402
    categorical_entropy, categorical_entropy_backward, categorical_log_prob,
    categorical_log_prob_backward, gaussian_entropy, gaussian_entropy_backward, gaussian_log_prob,
    gaussian_log_prob_backward,
)
from ppo_ref.spec.layers import orthogonal  # noqa: E402
from ppo_ref.spec.networks import (  # noqa: E402
    actor_critic_backward, actor_critic_forward, actor_critic_init,
)

TOL = dict(rtol=1e-10, atol=1e-10)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors: torch's thread pool only adds overhead (and suffers on a shared machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def t64(a):
    return torch.tensor(np.asarray(a), dtype=torch.float64)


def torch_tower(params, prefix, activation, final_activation=False):
    """An ``nn.Sequential`` of Linear + activation with ppo_ref's weights copied in."""
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[activation]
    layers = []
    i = 0
    while f"{prefix}w{i}" in params:
        w = params[f"{prefix}w{i}"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0], dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(t64(w))
            lin.bias.copy_(t64(params[f"{prefix}b{i}"]))
        layers.append(lin)
        layers.append(act())
        i += 1
    if not final_activation:
        layers.pop()
    return torch.nn.Sequential(*layers)


def torch_grads(seq, prefix):
    out = {}
    for i, lin in enumerate(m for m in seq if isinstance(m, torch.nn.Linear)):
        out[f"{prefix}w{i}"] = lin.weight.grad.numpy()
        out[f"{prefix}b{i}"] = lin.bias.grad.numpy()
    return out


@pytest.mark.parametrize("shared_trunk", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_actor_critic_forward_and_gradients_equal_torch(shared_trunk, activation):
    rng = np.random.default_rng(5)
    p = actor_critic_init(rng, 4, 3, activation=activation, shared_trunk=shared_trunk,
                          policy_gain=1.0)
    for k in p:  # non-zero biases
        if ".b" in k:
            p[k] = 0.1 * rng.standard_normal(p[k].shape)
    obs = rng.standard_normal((256, 4))
    d_pi = rng.standard_normal((256, 3))
    d_v = rng.standard_normal(256)

    logits, values, cache = actor_critic_forward(p, obs, activation, shared_trunk)
    grads = actor_critic_backward(p, cache, d_pi, d_v)

    x = t64(obs)
    if shared_trunk:
        trunk = torch_tower(p, "trunk.", activation, final_activation=True)
        pi, vf = torch_tower(p, "pi.", activation), torch_tower(p, "vf.", activation)
        z = trunk(x)
        t_logits, t_values = pi(z), vf(z)[:, 0]
        modules = {"trunk.": trunk, "pi.": pi, "vf.": vf}
    else:
        pi, vf = torch_tower(p, "pi.", activation), torch_tower(p, "vf.", activation)
        t_logits, t_values = pi(x), vf(x)[:, 0]
        modules = {"pi.": pi, "vf.": vf}
    ((t_logits * t64(d_pi)).sum() + (t_values * t64(d_v)).sum()).backward()

    np.testing.assert_allclose(logits, t_logits.detach().numpy(), **TOL)
    np.testing.assert_allclose(values, t_values.detach().numpy(), **TOL)
    expected = {}
    for prefix, seq in modules.items():
        expected.update(torch_grads(seq, prefix))
    assert set(expected) == set(grads)
    for k in grads:
        np.testing.assert_allclose(grads[k], expected[k], err_msg=k, **TOL)


def test_categorical_log_prob_entropy_and_gradients_equal_torch():
    rng = np.random.default_rng(6)
    logits = 2.0 * rng.standard_normal((64, 5))
    logits[::4, 2] = -np.inf  # masked action in every fourth row
    actions = rng.integers(0, 5, 64)
    actions[::4] = np.where(actions[::4] == 2, 0, actions[::4])
    d_lp, d_h = rng.standard_normal(64), rng.standard_normal(64)

    # torch gets the mask as -1e8 (sb3-contrib MaskablePPO's value; exp(-1e8 - max) is exactly
    # 0 in float64, so the distribution is the same). With -inf, torch's entropy gradient is
    # NaN on masked rows whenever |d_entropy| > 1: clamp(-inf -> finfo.min) * d overflows to
    # inf, times probability 0. ppo_ref's gradient there is exactly 0.
    z = t64(np.where(np.isneginf(logits), -1e8, logits)).requires_grad_(True)
    dist = torch.distributions.Categorical(logits=z)
    t_lp = dist.log_prob(torch.as_tensor(actions))
    t_h = dist.entropy()
    (t_lp * t64(d_lp)).sum().backward(retain_graph=True)
    g_lp = z.grad.numpy().copy()
    z.grad = None
    (t_h * t64(d_h)).sum().backward()
    g_h = z.grad.numpy().copy()

    np.testing.assert_allclose(categorical_log_prob(logits, actions), t_lp.detach().numpy(), **TOL)
    np.testing.assert_allclose(categorical_entropy(logits), t_h.detach().numpy(), **TOL)
    np.testing.assert_allclose(categorical_log_prob_backward(logits, actions, d_lp), g_lp, **TOL)
    np.testing.assert_allclose(categorical_entropy_backward(logits, d_h), g_h, **TOL)


def test_gaussian_log_prob_entropy_and_gradients_equal_torch():
    rng = np.random.default_rng(7)
    mean = rng.standard_normal((64, 3))
    log_std = 0.4 * rng.standard_normal(3)
    actions = rng.standard_normal((64, 3))
    d_lp, d_h = rng.standard_normal(64), rng.standard_normal(64)

    tm = t64(mean).requires_grad_(True)
    ts = t64(log_std).requires_grad_(True)
    dist = torch.distributions.Normal(tm, ts.exp())
    t_lp = dist.log_prob(t64(actions)).sum(-1)
    t_h = dist.entropy().sum(-1)
    ((t_lp * t64(d_lp)).sum() + (t_h * t64(d_h)).sum()).backward()

    np.testing.assert_allclose(gaussian_log_prob(mean, log_std, actions), t_lp.detach().numpy(), **TOL)
    np.testing.assert_allclose(gaussian_entropy(log_std, 64), t_h.detach().numpy(), **TOL)
    d_mean, d_ls_lp = gaussian_log_prob_backward(mean, log_std, actions, d_lp)
    d_ls_h = gaussian_entropy_backward(log_std, d_h)
    np.testing.assert_allclose(d_mean, tm.grad.numpy(), **TOL)
    np.testing.assert_allclose(d_ls_lp + d_ls_h, ts.grad.numpy(), **TOL)


@pytest.mark.parametrize("shape", [(3, 5), (5, 3), (4, 4)])
def test_orthogonal_init_statistics_match_torch(shape):
    """Same distribution as torch.nn.init.orthogonal_ (values differ: different generators)."""
    n = 1000
    gain = 1.7
    rng = np.random.default_rng(0)
    ours = np.stack([orthogonal(rng, shape, gain) for _ in range(n)])
    torch.manual_seed(0)
    theirs = np.stack([torch.nn.init.orthogonal_(torch.empty(shape, dtype=torch.float64), gain).numpy()
                       for _ in range(n)])
    rows, cols = shape
    gram = (lambda w: w @ w.T) if rows <= cols else (lambda w: w.T @ w)
    eye = gain**2 * np.eye(min(rows, cols))
    np.testing.assert_allclose(gram(ours[0]), eye, atol=1e-12)
    np.testing.assert_allclose(gram(theirs[0]), eye, atol=1e-12)
    # every entry: mean 0 and variance gain^2 / max(rows, cols) in both
    var = gain**2 / max(rows, cols)
    se_mean = math.sqrt(var / n)
    for w in (ours, theirs):
        assert np.abs(w.mean(axis=0)).max() < 5 * se_mean
        np.testing.assert_allclose(w.var(axis=0), var, rtol=0.2)  # ~4.5 standard errors
    # the marginal of one entry: the same quantiles (two-sample comparison, generous bound)
    q = [0.05, 0.25, 0.5, 0.75, 0.95]
    np.testing.assert_allclose(np.quantile(ours[:, 0, 0], q), np.quantile(theirs[:, 0, 0], q),
                               atol=0.08 * gain)
    # P(entry > 0) = 1/2 (the sign correction of QR) in both
    for w in (ours, theirs):
        assert 0.43 < np.mean(w[:, 0, 0] > 0) < 0.57


def test_adam_equals_torch_adam_over_several_steps():
    from ppo_ref.spec.optim import adam_init, adam_update

    rng = np.random.default_rng(8)
    params = {"w": rng.standard_normal((4, 3)), "b": rng.standard_normal(4),
              "log_std": np.zeros(2)}
    t_params = {k: t64(v).requires_grad_(True) for k, v in params.items()}
    lr, betas, eps = 3e-3, (0.9, 0.999), 1e-5
    opt = torch.optim.Adam(list(t_params.values()), lr=lr, betas=betas, eps=eps)
    state = adam_init(params)
    for step in range(12):
        scale = 10.0 ** rng.uniform(-6, 1)  # include tiny gradients, where eps matters
        grads = {k: scale * rng.standard_normal(v.shape) for k, v in params.items()}
        if step == 5:
            grads["b"][:] = 0.0  # a zero gradient still moves the param via momentum
        params, state = adam_update(params, grads, state, lr=lr, betas=betas, eps=eps)
        opt.zero_grad()
        for k, tp in t_params.items():
            tp.grad = t64(grads[k])
        opt.step()
        for k in params:
            np.testing.assert_allclose(params[k], t_params[k].detach().numpy(), rtol=1e-12,
                                       atol=1e-14, err_msg=f"{k} after step {step + 1}")
