"""The README's demo command runs and checks itself."""

import subprocess
import sys

from conftest import child_env


def test_demo_runs_and_checks_itself():
    env = child_env("XLA_FLAGS")  # the demo sets its own
    out = subprocess.run([sys.executable, "-m", "parop"], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "parop on 8 cpu devices" in out.stdout
    assert "forward:  6 all_to_all" in out.stdout and "all checks passed" in out.stdout


def test_plan_and_operator_displays():
    import jax.numpy as jnp

    import parop as po

    D = po.distribute(po.kron(po.DFT(8), po.DFT(10, jnp.float32)), (2, 1))
    assert "<pre>" in D.plan._repr_html_() and "all_to_all" in D.plan._repr_html_()
    assert repr(D) == "distribute(DFT(8) ⊗ rDFT(10), P('d0', None))"
    assert "distribute(" in D._repr_html_()
