"""Test configuration for validation/: the same bounded hypothesis profile as tests/, the
tests/ helpers (oracles, gradcheck) on the import path, and the commands started at the end of
collection (tests/early_commands.py)."""
import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import hypothesis_profiles  # noqa: E402,F401
from early_commands import (early_command, pytest_collection_finish,  # noqa: E402,F401
                            pytest_configure, pytest_pyfunc_call, pytest_sessionfinish)
