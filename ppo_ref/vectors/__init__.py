"""Golden vectors: ppo_ref's numbers as JSON, and a checker for another implementation's outputs
(the code is in :mod:`ppo_ref.vectors.cases`)."""
from ppo_ref.vectors.cases import *  # noqa: F401,F403
from ppo_ref.vectors.cases import __all__  # noqa: F401
