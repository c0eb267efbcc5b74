"""The package around the op: version, stubs, docstrings, `python -m attnkit`."""

import os
import re
import subprocess
import sys

import pytest

import attnkit
from attnkit import _attnkit

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_version_is_the_cmake_project_version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        cmake_version = re.search(r"project\(attnkit VERSION ([0-9.]+)", f.read()).group(1)
    assert attnkit.__version__ == cmake_version
    from importlib.metadata import version

    assert version("attnkit") == cmake_version


def test_typing_files_and_docstrings():
    package = os.path.dirname(attnkit.__file__)
    assert os.path.isfile(os.path.join(package, "py.typed"))
    assert os.path.isfile(os.path.join(package, "_attnkit.pyi"))
    doc = attnkit.attention.__doc__
    for word in ("key_lengths", "causal_offset", "masked_rows", "return_lse", "layout", "head_sink", "Raises"):
        assert word in doc
    assert _attnkit.attention.__doc__


def run_module(*args):
    return subprocess.run([sys.executable, "-m", "attnkit", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not _attnkit.has_cli, reason="built without the command-line tool")
def test_python_m_attnkit_info():
    r = run_module("info")
    assert r.returncode == 0, r.stderr
    assert attnkit.__version__ in r.stdout
    assert "cpu" in r.stdout


@pytest.mark.skipif(not _attnkit.has_cli, reason="built without the command-line tool")
def test_python_m_attnkit_verify_and_bench_list():
    r = run_module("verify", "--case", "size_1", "k_len_1", "--dtype", "float32")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed, 0 failed" in r.stdout
    r = run_module("bench", "--list")
    assert r.returncode == 0, r.stderr
    assert "bench" in r.stdout


@pytest.mark.skipif(not _attnkit.has_cli, reason="built without the command-line tool")
def test_python_m_attnkit_bad_arguments():
    r = run_module("no-such-command")
    assert r.returncode != 0
    assert r.stderr or r.stdout


@pytest.mark.skipif(not _attnkit.has_cli, reason="built without the command-line tool")
def test_cli_in_process_output_goes_to_sys_stdout(capsys):
    from attnkit.__main__ import main

    assert main(["info"]) == 0
    assert attnkit.__version__ in capsys.readouterr().out


def test_python_m_attnkit_without_cli():
    if _attnkit.has_cli:
        pytest.skip("the command-line tool is built in")
    r = run_module("info")
    assert r.returncode == 2 and "no command-line tool" in r.stderr
