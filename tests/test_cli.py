"""`python -m fattn`: a usage error is an error (a script or CI step must see it fail)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("args", [[], ["no-such-command"], ["info", "--no-such-flag"]])
def test_usage_errors_exit_non_zero(args):
    result = subprocess.run([sys.executable, "-m", "fattn", *args], capture_output=True, text=True)
    assert result.returncode != 0
    assert "usage:" in result.stderr


def test_info_names_the_toolchain():
    result = subprocess.run([sys.executable, "-m", "fattn", "info"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "library linked by " in result.stdout
