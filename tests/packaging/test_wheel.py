"""The wheel tells the truth about itself: built from a copy of the checkout and installed (not editable) into a fresh
virtual environment that sees the checkout nowhere, `contextspan serve` serves the browser demo at / (package data of
web_client) and `contextspan bench faults` runs with the fakes it ships (benchmarks/fakes), from a folder that is not
the checkout. The fresh environment borrows this interpreter's installed dependencies through a .pth line, which only
adds that folder to sys.path (the .pth files inside it, an editable install's among them, are not run)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest

from benchmarks.harness import free_port, stop_server, wait_ready

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"server", "frontend_model", "backend_agent", "contextspan_client", "benchmarks", "web_client"}
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache",
                                     "recordings", "artifacts")
# The child processes find only what is installed: no PYTHONPATH pointing back at the checkout.
ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "NO_TORCH_COMPILE": "1"}


def run(*cmd: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built in a copy: setuptools writes build/ and *.egg-info beside the sources it builds."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "contextspan"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    # The backend installed here if there is one (no network needed), else pip fetches it into an isolated build.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", tmp / "dist", ".", cwd=source)
    (built,) = (tmp / "dist").glob("contextspan-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=venv)
    site = Path(run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                    cwd=venv).strip())
    (site / "borrowed-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run(venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel, cwd=venv)
    return venv


def test_the_wheel_holds_the_packages_and_the_page_but_no_tests(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == PACKAGES
    shipped = {Path(name).name for name in names if name.startswith("web_client/")}
    assert {path.name for path in (ROOT / "web_client").iterdir() if path.is_file()} <= shipped
    assert {"benchmarks/fakes/faulty_server.py", "benchmarks/harness/servers.py"} <= set(names)


def test_the_installed_server_serves_the_page_and_its_health_from_anywhere(venv: Path, tmp_path: Path) -> None:
    where = run(venv / "bin" / "python", "-c", "import sys\n"
                "for m in sys.argv[1:]: print(__import__(m).__file__)", *sorted(PACKAGES), cwd=tmp_path).split()
    assert len(where) == len(PACKAGES) and all(Path(f).is_relative_to(venv) for f in where), where
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen([venv / "bin" / "contextspan", "serve", "--profile", "tiny", "--port", str(port),
                                    "--no-asr"], cwd=tmp_path, env=ENV, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(process, url, log, timeout=300)
        page = httpx.get(f"{url}/", timeout=10)
        script = httpx.get(f"{url}/app.js", timeout=10)
        health = httpx.get(f"{url}/healthz", timeout=10)
    finally:
        stop_server(process)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.text == (ROOT / "web_client" / "index.html").read_text()
    assert script.status_code == 200 and script.text == (ROOT / "web_client" / "app.js").read_text()
    assert health.status_code == 200 and health.json()["status"] == "alive"


def test_the_installed_fault_benchmark_runs_with_the_fakes_it_ships(venv: Path, tmp_path: Path) -> None:
    contextspan = venv / "bin" / "contextspan"
    assert "usage: contextspan bench faults" in run(contextspan, "bench", "faults", "--help", cwd=tmp_path)
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng): the benchmark speaks its question")
    report = tmp_path / "faults.json"
    run(contextspan, "bench", "faults", "--seconds", "4", "--scenarios", "forward raises in one row", "--json", report,
        cwd=tmp_path)
    (row,) = json.loads(report.read_text())["rows"]
    # The faulty server (python -m benchmarks.fakes.faulty_server) ran from the install: its ForwardFault closed the
    # session whose row raised, and the other one kept going.
    assert row["scenario"] == "forward raises in one row"
    assert row["sessions_closed_1011"] == 1 and row["sessions_kept"] == 1, row
