"""The ``gpu`` / ``multi_gpu`` markers of tests/conftest.py: a test that cannot get its GPUs is skipped,
unless BATCHLU_REQUIRE_GPU / BATCHLU_REQUIRE_GPUS say the GPUs must be there; then it fails, saying why.

Each case runs pytest in a subprocess on a tiny marked test, with this conftest and with
``CUDA_VISIBLE_DEVICES`` empty, so that no GPU is found on any machine (on the GPU machine CUDA then
reports no device; elsewhere CuPy is missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
TESTS = '''
import pytest

@pytest.mark.gpu
def test_needs_one():
    assert True

@pytest.mark.multi_gpu
def test_needs_two():
    assert True

def test_needs_none():
    assert True
'''


def _pytest(tmp_path, **env) -> tuple[subprocess.CompletedProcess, dict[str, tuple[str, str]]]:
    """Run the tiny tests; returns the process and, per test, (outcome, message) from a JUnit report:
    outcome ``passed``, ``skipped``, ``error`` (a failure in setup, where the markers act) or ``failure``."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_marked.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: one GPU\n    multi_gpu: two GPUs\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BATCHLU_REQUIRE_GPU")}
    environ.update(CUDA_VISIBLE_DEVICES="", **env)
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_marked.py",
                             "--junitxml=report.xml"],
                            cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=120)
    outcomes = {}
    if (tmp_path / "report.xml").exists():
        for case in ElementTree.parse(tmp_path / "report.xml").getroot().iter("testcase"):
            children = [child for child in case if child.tag in ("skipped", "error", "failure")]
            outcome = children[0].tag if children else "passed"
            outcomes[case.get("name")] = (outcome, children[0].get("message", "") if children else "")
    return result, outcomes


def test_without_the_setting_gpu_tests_skip_saying_why(tmp_path):
    result, outcomes = _pytest(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_needs_one": "skipped", "test_needs_two": "skipped", "test_needs_none": "passed"}, outcomes
    one, two = outcomes["test_needs_one"][1], outcomes["test_needs_two"][1]
    assert one.startswith("needs 1 CUDA GPU; found 0: ") and two.startswith("needs 2 CUDA GPUs; found 0: ")
    # the reason names the cause: CuPy missing, or CUDA's own error text
    assert any(why in one for why in ("CuPy cannot be imported", "counting CUDA GPUs failed",
                                      "reports no GPU")), one


def test_require_gpu_turns_the_skip_into_a_failure_with_the_reason(tmp_path):
    result, outcomes = _pytest(tmp_path, BATCHLU_REQUIRE_GPU="1")
    assert result.returncode == 1, result.stdout + result.stderr
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_needs_one": "error", "test_needs_two": "skipped", "test_needs_none": "passed"}, outcomes
    message = outcomes["test_needs_one"][1]
    assert message.startswith("failed on setup with \"Failed: needs 1 CUDA GPU; found 0: "), message
    assert "BATCHLU_REQUIRE_GPU=1: GPU tests may not be skipped here" in message, message
    assert outcomes["test_needs_two"][1].startswith("needs 2 CUDA GPUs; found 0: ")


def test_require_gpus_makes_the_multi_gpu_tests_required_too(tmp_path):
    result, outcomes = _pytest(tmp_path, BATCHLU_REQUIRE_GPUS="2")
    assert result.returncode == 1, result.stdout + result.stderr
    assert {name: outcome for name, (outcome, _) in outcomes.items()} == {
        "test_needs_one": "error", "test_needs_two": "error", "test_needs_none": "passed"}, outcomes
    message = outcomes["test_needs_two"][1]
    assert "needs 2 CUDA GPUs; found 0: " in message and "BATCHLU_REQUIRE_GPUS=2" in message, message


@pytest.mark.parametrize("env, words", [
    ({"BATCHLU_REQUIRE_GPU": "yes"}, "Expected BATCHLU_REQUIRE_GPU to be 0 or 1. Got 'yes' instead."),
    ({"BATCHLU_REQUIRE_GPU": "2"}, "Expected BATCHLU_REQUIRE_GPU to be 0 or 1. Got 2 instead"),
    ({"BATCHLU_REQUIRE_GPUS": "-1"}, "Expected BATCHLU_REQUIRE_GPUS to be a whole number of GPUs."),
])
def test_a_malformed_setting_stops_the_run(tmp_path, env, words):
    result, outcomes = _pytest(tmp_path, **env)
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage error
    assert words in result.stderr, result.stderr
    assert not outcomes  # no test ran


def test_require_gpu_0_is_off(tmp_path):
    result, outcomes = _pytest(tmp_path, BATCHLU_REQUIRE_GPU="0")
    assert result.returncode == 0, result.stdout + result.stderr
    assert outcomes["test_needs_one"][0] == "skipped", outcomes
