"""``ppo-ref train --resume`` killed (SIGKILL) at every file operation of its rewrite of the run
directory, and at a few later points, loses nothing and still resumes to the uninterrupted
run's files (tests/resume_kill_driver.py does the work, in its own processes)."""
import json
import os
import sys

import pytest

DRIVER = os.path.join(os.path.dirname(__file__), "resume_kill_driver.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))


# the driver runs for seconds in its own processes: started at the end of collection
# (tests/early_commands.py)
@pytest.mark.early_command([sys.executable, DRIVER, "{dir}", "--points", "1",
                            "--chain-every", "4"], env=ENV, timeout=600)
def test_a_resume_killed_at_any_point_of_its_rewrite_loses_nothing(early_command):
    proc, _ = early_command
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert report["problems"] == [], "\n".join(report["problems"][:20])
    assert report["rewrite_operations"] >= 10      # every operation of the rewrite was a kill point
    assert report["kills"] >= report["rewrite_operations"]
    assert proc.returncode == 0
