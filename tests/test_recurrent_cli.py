"""`ppo-ref train --policy lstm`: run-directory files, eval, and an exact resume."""
import json
import os

import numpy as np

from ppo_ref.io.checkpoint import load_checkpoint
from ppo_ref.cli import main

TRAIN = ["train", "--policy", "lstm", "--env", "ppo_ref/MemoryCue-v0", "--seed", "3", "--quiet",
         "--set", "n_envs=4", "--set", "n_steps=16", "--set", "batch_size=32",
         "--set", "n_epochs=2", "--set", "lstm_hidden_size=8", "--set", "net_arch=16"]


def test_train_lstm_eval_and_exact_resume(tmp_path, capsys):
    straight, split = str(tmp_path / "straight"), str(tmp_path / "split")
    assert main(TRAIN + ["--total-timesteps", "384", "--run-dir", straight]) == 0
    for name in ("config.json", "metrics.csv", "episodes.csv", "checkpoint.npz"):
        assert os.path.exists(os.path.join(straight, name)), name
    arrays, meta = load_checkpoint(os.path.join(straight, "checkpoint.npz"))
    assert meta["trainer"] == "RecurrentPPOTrainer" and meta["policy"] == "lstm"
    assert arrays["collector/state.h"].shape == (2, 4, 8)  # actor + critic LSTM, 4 envs, H = 8

    assert main(TRAIN + ["--total-timesteps", "192", "--run-dir", split]) == 0
    assert main(["train", "--resume", split, "--total-timesteps", "384", "--quiet"]) == 0
    resumed, _ = load_checkpoint(os.path.join(split, "checkpoint.npz"))
    assert set(resumed) == set(arrays)
    for key in arrays:
        if key.startswith(("params/", "adam/", "collector/")):
            np.testing.assert_array_equal(resumed[key], arrays[key], err_msg=key)

    capsys.readouterr()
    assert main(["eval", straight, "--episodes", "5", "--deterministic"]) == 0
    assert "5 episodes" in capsys.readouterr().out
    with open(os.path.join(straight, "config.json")) as fh:
        assert json.load(fh)["policy"] == "lstm"
