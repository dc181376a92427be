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


def test_info_says_which_arch_serves_what_the_picked_one_lacks():
    # An 8.9 GPU beside an sm_86 build: sm_89's cubins hold the FP8 variants alone (configs.json
    # served_by), sm_86's the others; an arch that lacks nothing names no other.
    from fattn.__main__ import _served

    def row(arch, flags_key, block_d=64):
        return {"arch": arch, "dtype": "bf16", "block_d": block_d, "flags_key": flags_key}

    rows = [row(86, 0), row(86, 1), row(86, 0, 128), row(89, 5), row(80, 0), row(80, 1), row(80, 0, 128)]
    assert _served((89, False, 86), rows) == "sm_89 cubins (sm_86's for the 3 variants sm_89 lacks)"
    assert _served((86, False, 80), rows) == "sm_86 cubins"
    assert _served((86, True, None), rows) == "sm_86 PTX (JIT-compiled by the driver: no cubin for this GPU)"
    assert _served(None, rows) == "NOT SUPPORTED"
