"""The installed package's command-line side: the cases shipped inside it, the `attnkit` console script, the
progress line, bench --csv / --plot, gqa --json, and Ctrl-C stopping a long verify."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import attnkit
from attnkit import _attnkit
from attnkit.__main__ import cases_dir

pytestmark = pytest.mark.skipif(not _attnkit.has_cli, reason="built without the command-line tool")


def run_module(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "attnkit", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_the_cases_ship_inside_the_package(tmp_path):
    assert os.path.isfile(os.path.join(cases_dir(), "models.json"))
    assert os.path.dirname(cases_dir()) == os.path.dirname(attnkit.__file__)
    r = run_module("verify", "--case", "size_1", "--dtype", "float32", cwd=tmp_path)  # from another directory
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 passed, 0 failed" in r.stdout


def test_console_script():
    script = shutil.which("attnkit", path=os.path.dirname(sys.executable))
    assert script, "the attnkit console script is not installed beside the interpreter"
    r = subprocess.run([script, "info"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and attnkit.__version__ in r.stdout, r.stderr


def test_verify_shows_progress():
    r = run_module("verify", "--case", "size_1", "k_len_1", "--dtype", "float32")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [l for l in r.stdout.splitlines() if "PASS" in l]
    assert lines[0].startswith("[1/2, ") and "s left]" in lines[0] and lines[1].startswith("[2/2, ")


def test_bench_csv_and_plot(tmp_path):
    pytest.importorskip("matplotlib")
    csv_path, png = tmp_path / "b.csv", tmp_path / "b.png"
    r = run_module("bench", "--case", "size_1", "--dtype", "float32", "--min-time", "0.01", "--csv", str(csv_path),
                   "--plot", str(png))
    assert r.returncode == 0, r.stdout + r.stderr
    rows = csv_path.read_text().splitlines()
    assert rows[0].startswith("case,file,dtype,fused_ms") and len(rows) == 2 and rows[1].startswith('"size_1"')
    assert float(rows[1].split(",")[3]) > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_gqa_json(tmp_path):
    out = tmp_path / "g.json"
    r = run_module("gqa", "--prompt", "16", "--steps", "3", "--heads", "4", "--kv-heads", "2", "--head-size", "32",
                   "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    j = json.loads(out.read_text())
    assert j["settings"]["heads"] == 4 and len(j["decode_ms"]) == 3 and j["prefill_ms"] > 0


def test_ctrl_c_stops_a_long_verify():
    p = subprocess.Popen([sys.executable, "-m", "attnkit", "verify", "--backend", "reference"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert "verify:" in p.stdout.readline()  # started
        p.stdout.readline()  # one case done
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, (out[-500:], err[-500:])
    assert "interrupted" in out + err
    assert time.monotonic() - t0 < 60
