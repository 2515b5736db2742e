"""The readable tier of ppo_ref: plain NumPy float64 definitions of every computation."""
