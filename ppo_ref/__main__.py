"""``python -m ppo_ref`` is the same as the ``ppo-ref`` command."""
import sys

from ppo_ref.cli import main

sys.exit(main())
