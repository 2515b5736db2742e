"""Full PPO update parity: ppo_ref (``PPOConfig.preset("sb3")``) vs Stable-Baselines3's
``PPO.train()``: all epochs and minibatches, identical initial weights, identical minibatch
order, every parameter compared after the update.

How the two are made to see the same thing:

* **Weights.** SB3's ``MlpPolicy`` (``net_arch=dict(pi=[64, 64], vf=[64, 64])``, tanh) is
  copied into ppo_ref's parameter dict: ``mlp_extractor.policy_net.0`` -> ``pi.w0/pi.b0``,
  ``policy_net.2`` -> ``pi.w1/pi.b1``, ``action_net`` -> ``pi.w2/pi.b2``, and the same for
  ``value_net`` -> ``vf.*`` (both use torch's ``[out, in]`` weight layout).
* **Precision.** SB3 runs in float64: ``policy.double()`` (parameters converted in place, so the
  optimizer keeps them), a replaced ``rollout_buffer.get`` that yields float64 tensors, and
  ``policy.extract_features`` replaced by the identity in float64 (SB3's ``preprocess_obs``
  would cast Box observations to float32; for flat Box observations it is otherwise a no-op).
* **Minibatch order.** SB3 draws ``np.random.permutation`` inside ``RolloutBuffer.get``; here
  ``get`` is replaced by a generator that yields the minibatches of a permutation list fixed in
  advance (one per epoch), and ppo_ref's ``ppo_ref.spec.update.run_epochs`` receives the same index
  sets through its ``minibatches(epoch)`` callback. Rows are SB3's flattened (env-major) rows.
* **Data.** Observations and actions are random; ``old_log_probs`` and ``old_values`` are the
  initial policy's own (so the first minibatch has ratio 1, docs/specification.md §5); advantages and returns
  are random.

Scenarios: (a) SB3 defaults (no value clipping, no target_kl); (b) ``clip_range_vf=0.1`` (SB3's
clipped-prediction value loss = ppo_ref ``value_loss_mode="sb3"``) and a small ``target_kl``
so the KL early stop fires mid-update (compares where it stopped); (c) end to end through the
trainer: ``PPOTrainer.update`` on a 2-env ``Rollout`` with terminations and truncations (its GAE
and ``train_on``) against SB3's ``RolloutBuffer.compute_returns_and_advantage`` (truncations
folded into the rewards) followed by ``PPO.train()``; the trainer's ``minibatch_rng`` is
replaced by an object whose ``permutation`` returns SB3's permutations mapped from SB3's
env-major rows to the trainer's time-major rows.

Run: ``python validation/parity_sb3_update.py`` (needs torch and stable_baselines3).
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces

from parity_common import Row, print_table

from ppo_ref.config import PPOConfig
from ppo_ref.spec.optim import adam_init
from ppo_ref.spec.update import Minibatch, run_epochs
from ppo_ref.tiers import tier_for
from ppo_ref.train.policies import MLPPolicy

OBS_DIM, N_ACTIONS = 4, 3


class _BoxEnv(gym.Env):
    """Spaces only (SB3 needs an env to build the model; nothing is ever stepped)."""

    observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = spaces.Discrete(N_ACTIONS)

    def reset(self, *, seed=None, options=None):
        return np.zeros(OBS_DIM, np.float32), {}

    def step(self, action):
        return np.zeros(OBS_DIM, np.float32), 0.0, False, False, {}


TOWER_LAYOUT = (("mlp_extractor.policy_net.0", "pi.w0", "pi.b0"),
                ("mlp_extractor.policy_net.2", "pi.w1", "pi.b1"),
                ("action_net", "pi.w2", "pi.b2"),
                ("mlp_extractor.value_net.0", "vf.w0", "vf.b0"),
                ("mlp_extractor.value_net.2", "vf.w1", "vf.b1"),
                ("value_net", "vf.w2", "vf.b2"))


def params_from_torch(module, layout=TOWER_LAYOUT) -> dict:
    """ppo_ref parameter dict (float64 copies) from a torch module's named Linear layers."""
    state = {k: v.detach().cpu().double().numpy().copy() for k, v in module.state_dict().items()}
    params = {}
    for prefix, w, b in layout:
        params[w] = state[prefix + ".weight"]
        params[b] = state[prefix + ".bias"]
    return params


def max_param_diff(params: dict, module, layout=TOWER_LAYOUT) -> float:
    other = params_from_torch(module, layout)
    return max(float(np.max(np.abs(params[k] - other[k]))) for k in other)


def spec_policy(config: PPOConfig) -> MLPPolicy:
    """The MLP policy of ``config`` on the readable tier (plain NumPy float64)."""
    return MLPPolicy(_BoxEnv.observation_space, _BoxEnv.action_space, config, tier_for("spec"))


def make_batch(rng, policy: MLPPolicy, params: dict, n_rows: int) -> dict:
    """Flat rollout rows; old log-probs and values from the initial policy itself."""
    obs = rng.normal(size=(n_rows, OBS_DIM))
    actions = rng.integers(0, N_ACTIONS, n_rows)
    log_probs, _, values, _ = policy.evaluate(params, (obs, actions))
    return {"observations": obs, "actions": actions, "old_log_probs": log_probs,
            "old_values": values, "advantages": rng.normal(size=n_rows),
            "returns": values + rng.normal(size=n_rows)}


def permutations(rng, n_rows: int, n_epochs: int):
    return [rng.permutation(n_rows) for _ in range(n_epochs)]


def chunks(perm, batch_size):
    return [perm[i:i + batch_size] for i in range(0, len(perm), batch_size)]


def run_ppo_ref(config: PPOConfig, params: dict, batch: dict, perms) -> tuple:
    """ppo_ref's update through ``run_epochs`` with the given minibatch order."""
    policy = spec_policy(config)

    def minibatches(epoch):
        for idx in chunks(perms[epoch], config.batch_size):
            yield Minibatch(batch["old_log_probs"][idx], batch["advantages"][idx],
                            batch["returns"][idx], batch["old_values"][idx],
                            (batch["observations"][idx], batch["actions"][idx]))

    new_params, _, stats = run_epochs(
        dict(params), adam_init(params), config=config, lr=config.learning_rate,
        clip_range=config.clip_range, minibatches=minibatches, evaluate=policy.evaluate,
        backward=policy.backward)
    return new_params, stats


def sb3_model(config: PPOConfig, seed: int):
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure
    model = PPO("MlpPolicy", _BoxEnv(), learning_rate=config.learning_rate,
                n_steps=config.n_steps, batch_size=config.batch_size, n_epochs=config.n_epochs,
                gamma=config.gamma, gae_lambda=config.gae_lambda, clip_range=config.clip_range,
                clip_range_vf=config.clip_range_vf, normalize_advantage=config.normalize_advantage,
                ent_coef=config.ent_coef, vf_coef=config.vf_coef,
                max_grad_norm=config.max_grad_norm, target_kl=config.target_kl,
                policy_kwargs=dict(net_arch=dict(pi=list(config.net_arch),
                                                 vf=list(config.net_arch)),
                                   activation_fn=th.nn.Tanh),
                seed=seed, device="cpu")
    model.set_logger(configure(None, [""]))
    model.policy.double()
    # SB3's preprocess_obs casts Box observations with ``obs.float()`` (float32); the
    # observations here are already flat float64 rows, so feature extraction is the identity.
    model.policy.extract_features = lambda obs, features_extractor=None: obs.double()
    return model


def run_sb3(model, batch: dict, perms, batch_size: int) -> int:
    """``PPO.train()`` with ``rollout_buffer.get`` replaced: float64 samples in our order.
    Returns the number of minibatches SB3 evaluated."""
    from stable_baselines3.common.type_aliases import RolloutBufferSamples
    t = {k: th.as_tensor(v, dtype=th.float64) for k, v in batch.items()}
    calls = {"epoch": 0, "minibatches": 0}

    def get(_batch_size=None):
        perm = perms[calls["epoch"]]
        calls["epoch"] += 1
        for idx in chunks(perm, batch_size):
            calls["minibatches"] += 1
            i = th.as_tensor(idx)
            yield RolloutBufferSamples(t["observations"][i], t["actions"][i].reshape(-1, 1),
                                       t["old_values"][i], t["old_log_probs"][i],
                                       t["advantages"][i], t["returns"][i])

    buf = model.rollout_buffer
    buf.get = get
    buf.values = batch["old_values"].reshape(-1, 1).copy()      # for SB3's explained_variance
    buf.returns = batch["returns"].reshape(-1, 1).copy()
    model._current_progress_remaining = 1.0
    model.train()
    return calls["minibatches"]


SCENARIOS = {
    "defaults": dict(),
    "clip_range_vf=0.1 + target_kl=0.003": dict(clip_range_vf=0.1, target_kl=0.003),
}


class _InjectedPermutations:
    """Stands in for ``PPOTrainer.minibatch_rng``, giving the given permutations in order
    through ``permutation(n)``, the one draw per epoch of
    ``ppo_ref.spec.update.feedforward_minibatches``."""

    def __init__(self, perms):
        self._perms = iter(perms)

    def permutation(self, n):
        perm = np.asarray(next(self._perms))
        assert len(perm) == n
        return perm


def run_trainer_scenario(seed: int = 0) -> list:
    """End to end from a Rollout: ``PPOTrainer.update`` (GAE with truncations + train_on) vs
    SB3's ``compute_returns_and_advantage`` (rewards folded) + ``PPO.train()``, 2 envs.

    SB3 flattens env-major (row ``n * T + t``), the trainer time-major (row ``t * N + n``): the
    trainer receives SB3's permutations with every row index mapped accordingly.
    """
    from parity_gae_sb3 import sb3_gae
    from ppo_ref import PPOTrainer, episode_starts
    from ppo_ref.train.rollout import Rollout

    rng = np.random.default_rng(seed + 100)
    T, N = 16, 2
    config = PPOConfig.preset("sb3", n_envs=N, n_steps=T, batch_size=8, n_epochs=3,
                              learning_rate=3e-3, ent_coef=0.01, net_arch=(64, 64))
    model = sb3_model(config, seed)
    params = params_from_torch(model.policy)
    venv = gym.vector.SyncVectorEnv([_BoxEnv for _ in range(N)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    trainer = PPOTrainer(venv, config, seed=seed)
    trainer.params = params
    trainer.adam_state = adam_init(params)
    policy = trainer.policy
    obs = rng.normal(size=(T, N, OBS_DIM))
    actions = rng.integers(0, N_ACTIONS, (T, N))
    log_probs, _, values, _ = policy.evaluate(params, (obs.reshape(T * N, OBS_DIM),
                                                       actions.reshape(-1)))
    values, log_probs = values.reshape(T, N), log_probs.reshape(T, N)
    terminated = rng.random((T, N)) < 0.1
    truncated = rng.random((T, N)) < 0.25
    fold = truncated & ~terminated
    final_values = np.where(fold, policy.values(params, rng.normal(size=(T * N, OBS_DIM)),
                                                None, None).reshape(T, N), 0.0)
    last_values = policy.values(params, rng.normal(size=(N, OBS_DIM)), None, None)
    initial = np.ones(N, dtype=bool)
    rollout = Rollout(observations=obs, actions=actions, rewards=rng.normal(size=(T, N)),
                      terminated=terminated, truncated=truncated,
                      episode_starts=episode_starts(terminated, truncated, initial),
                      values=values, log_probs=log_probs, final_values=final_values,
                      last_values=last_values)
    perms_sb3 = permutations(rng, T * N, config.n_epochs)
    to_time_major = lambda i: (i % T) * N + i // T  # noqa: E731  SB3 row -> trainer row
    trainer.minibatch_rng = _InjectedPermutations([to_time_major(p) for p in perms_sb3])
    stats = trainer.update(rollout)

    x = dict(rewards=rollout.rewards, values=values, terminated=terminated, truncated=truncated,
             last_values=last_values, final_values=final_values, initial=initial)
    adv, ret = sb3_gae(x, config.gamma, config.gae_lambda, float64=True)
    env_major = lambda a: np.ascontiguousarray(np.swapaxes(a, 0, 1)).reshape(  # noqa: E731
        (T * N,) + a.shape[2:])
    batch = {"observations": env_major(obs), "actions": env_major(actions),
             "old_log_probs": env_major(log_probs), "old_values": env_major(values),
             "advantages": env_major(adv), "returns": env_major(ret)}
    run_sb3(model, batch, perms_sb3, config.batch_size)
    err = max_param_diff(trainer.params, model.policy)
    return [Row("SB3 compute_returns_and_advantage + train() vs PPOTrainer.update", "all parameters",
                err, 1e-6, err <= 1e-6,
                f"2 envs, {int(fold.sum())} truncations folded, env-major/time-major rows "
                f"mapped; {int(stats['n_gradient_steps'])} steps")]


def run(seed: int = 0) -> list:
    rows = []
    for name, extra in SCENARIOS.items():
        rng = np.random.default_rng(seed)
        config = PPOConfig.preset("sb3", n_steps=32, batch_size=16, n_epochs=4,
                                  learning_rate=3e-3, ent_coef=0.01, net_arch=(64, 64), **extra)
        n_rows = config.n_steps  # one env
        model = sb3_model(config, seed)
        params = params_from_torch(model.policy)
        batch = make_batch(rng, spec_policy(config), params, n_rows)
        perms = permutations(rng, n_rows, config.n_epochs)
        new_params, stats = run_ppo_ref(config, params, batch, perms)
        n_sb3 = run_sb3(model, batch, perms, config.batch_size)
        moved = max(float(np.max(np.abs(new_params[k] - params[k]))) for k in params)
        err = max_param_diff(new_params, model.policy)
        rows.append(Row(f"SB3 PPO.train(), {name}", "all parameters", err, 1e-6, err <= 1e-6,
                        f"float64; params moved by up to {moved:.2e}; "
                        f"{int(stats['n_gradient_steps'])} steps"))
        # SB3 evaluates one more minibatch than it steps when the KL stop fires before a step.
        n_ref = int(stats["n_gradient_steps"]) + int(stats["kl_stopped"])
        rows.append(Row(f"SB3 PPO.train(), {name}", "minibatches evaluated",
                        float(abs(n_ref - n_sb3)), 0.0, n_ref == n_sb3,
                        f"ppo_ref {n_ref}, SB3 {n_sb3}, kl_stopped={bool(stats['kl_stopped'])}"))
        if config.clip_range_vf is not None:
            # the reference value-clipping form (docs/specification.md §4) ("max", baselines/CleanRL) is a real difference
            ref_cfg = config.replace(value_loss_mode="max")
            ref_params, _ = run_ppo_ref(ref_cfg, params, batch, perms)
            diff = max_param_diff(ref_params, model.policy)
            rows.append(Row(f"SB3 PPO.train(), {name}", "value_loss_mode='max' instead",
                            diff, 1e-6, diff > 1e-6,
                            "differs: SB3 regresses the clipped prediction, the max form "
                            "takes the larger of clipped and unclipped errors"))
    return rows + run_trainer_scenario(seed)


def main() -> list:
    rows = run()
    print_table("Full PPO update: ppo_ref (sb3 preset) vs SB3 PPO.train()", rows)
    return rows


if __name__ == "__main__":
    main()
