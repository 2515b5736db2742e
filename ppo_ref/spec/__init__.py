"""The readable tier of ppo_ref: plain NumPy, float64, and loops in the papers' notation."""
