"""Test configuration for validation/: the same bounded hypothesis profile as tests/, and the
tests/ helpers (oracles, gradcheck) on the import path."""
import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import hypothesis_profiles  # noqa: E402,F401
