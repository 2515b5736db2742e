"""``ppo-ref train --resume`` killed (SIGKILL) at every file operation of its rewrite of the run
directory, and at a few later points, loses nothing and still resumes to the uninterrupted
run's files (tests/resume_kill_driver.py does the work, in its own processes)."""
import json
import os
import subprocess
import sys

DRIVER = os.path.join(os.path.dirname(__file__), "resume_kill_driver.py")


def test_a_resume_killed_at_any_point_of_its_rewrite_loses_nothing(tmp_path):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, DRIVER, str(tmp_path), "--points", "1", "--chain-every", "4"],
                          capture_output=True, text=True, timeout=600, env=env)
    lines = proc.stdout.strip().splitlines()
    assert lines, proc.stderr[-2000:]
    report = json.loads(lines[-1])
    assert report["problems"] == [], "\n".join(report["problems"][:20])
    assert report["rewrite_operations"] >= 10      # every operation of the rewrite was a kill point
    assert report["kills"] >= report["rewrite_operations"]
    assert proc.returncode == 0
