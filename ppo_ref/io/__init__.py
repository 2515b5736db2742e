"""Files: checkpoints (:mod:`~ppo_ref.io.checkpoint`: bit-exact npz of parameters, optimizer
and RNG state, JSON metadata) and run directories (:mod:`~ppo_ref.io.runlog`: config.json,
metrics/episode/timing CSVs, the progress line). NumPy and the standard library only."""
