"""The lent GPU machine's Python, as scripts/gpu_check.sh needs to know it: the one place that says what it holds.

There `python3` is itself a venv's interpreter (/opt/torch/.venv/bin/python3, Python 3.12) holding torch 2.11 and the
packages below; nothing can be downloaded there, and one call carries at most 64 MiB (the working tree included). So
`prep` carries the wheels it lacks and no others, the check installs them with `pip --target` into a folder on the
path of every phase (a venv made from a venv's interpreter would not see that torch), and a dry run here reproduces
the layout: a venv holding this machine's torch and the packages the lent machine has, and nothing else.

    python scripts/gpu_machine.py select FROM TO       copy the wheels of FROM that the machine lacks into TO
    python scripts/gpu_machine.py size WHEELS [--limit-mib N]
                                                       what a call would carry (tree + wheels); fails over the limit
    python scripts/gpu_machine.py fake-machine DEST [--from-python PY]
                                                       a venv at DEST with PY's torch and the machine's packages
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# KINDS.md's package list for `nvidia-h200`, as read on a machine running its image on 2026-11-17.
MACHINE_PACKAGES = frozenset({
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama",
    "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x",
    "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore",
    "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
    "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader",
    "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py",
    "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict",
    "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda",
    "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
    "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
    "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13",
    "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless", "opt-einsum",
    "opt-einsum-fx", "optax", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft",
    "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil", "py-cpuinfo",
    "pyarrow", "pybind11", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest",
    "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentence-transformers", "sentencepiece", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torch-geometric", "torchaudio", "torchdiffeq", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp"
})
# Held there at a version the code was not written for, so carried all the same: safetensors 0.8.0 there, where
# moshi 0.2.13 and pyproject pin <0.8. (numpy 2.5.2 and huggingface_hub 1.x there are past moshi's pins too, but torch
# 2.11 there is built against that numpy, and moshi's model code runs on it: the machine's are used.)
# typing-extensions: its version there is not known, and pydantic needs a recent one; newer ones break nothing.
CARRIED_ANYWAY = frozenset({"safetensors", "typing-extensions"})
LIMIT_MIB = 60.0  # of the 64 MiB a call may carry: room for the results' round trip and a file added late
MIB = 2**20


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name(path: Path) -> str:
    return normalise(path.name.split("-", 1)[0])


def lacking(name: str) -> bool:
    name = normalise(name)
    return name not in MACHINE_PACKAGES or name in CARRIED_ANYWAY


def select(source: Path, target: Path) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    kept = [w for w in sorted(source.glob("*.whl")) if lacking(wheel_name(w))]
    for wheel in kept:
        shutil.copy2(wheel, target / wheel.name)
    return kept


def tree_bytes(root: Path) -> int:
    """What a call sends of the repository: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.split(b"\0")
    paths = {root / os.fsdecode(p) for p in listed if p}
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def size(wheels: Path, limit_mib: float) -> tuple[float, float, bool]:
    tree, carried = tree_bytes(ROOT) / MIB, folder_bytes(wheels) / MIB
    return tree, carried, tree + carried <= limit_mib


# What the fake machine's site-packages links from the source interpreter: the machine's packages, and torch's own
# CUDA libraries under whatever names this machine's torch build gives them.
LINKED_PREFIXES = ("nvidia-", "cuda-")
FAKE_OWN = frozenset({"pip", "setuptools", "wheel"})  # the new venv has its own


def fake_machine(dest: Path, source_python: str) -> Path:
    """A venv (its interpreter a venv's, as there) whose site-packages links, from `source_python`, torch and every
    package the lent machine holds, and nothing else: what the check needs beyond that must come from the wheels."""
    venv.EnvBuilder(with_pip=True, clear=True).create(dest)
    python = dest / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    listing = subprocess.run([source_python, "-c", _LIST_DISTRIBUTIONS], capture_output=True, text=True, check=True)
    for name, top_levels in json.loads(listing.stdout).items():
        if normalise(name) in FAKE_OWN or not (normalise(name) in MACHINE_PACKAGES
                                               or normalise(name).startswith(LINKED_PREFIXES)):
            continue
        for top in top_levels:
            link = site / Path(top).name
            if not link.exists():
                link.symlink_to(top)
    return python


# Run by the source interpreter: each distribution's top-level entries in its site-packages (its dist-info included).
_LIST_DISTRIBUTIONS = """
import importlib.metadata as md, json, sysconfig
from pathlib import Path
site = Path(sysconfig.get_paths()["purelib"]).resolve()
out = {}
for dist in md.distributions():
    base = Path(dist._path).resolve().parent
    if base != site:
        continue
    tops = {str(base / Path(str(f)).parts[0]) for f in (dist.files or []) if not str(f).startswith("..")}
    tops.add(str(Path(dist._path).resolve()))
    out[dist.metadata["Name"]] = sorted(t for t in tops if not t.endswith("__pycache__") and Path(t).exists())
print(json.dumps(out))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    sel = commands.add_parser("select")
    sel.add_argument("source", type=Path)
    sel.add_argument("target", type=Path)
    siz = commands.add_parser("size")
    siz.add_argument("wheels", type=Path)
    siz.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    fake = commands.add_parser("fake-machine")
    fake.add_argument("dest", type=Path)
    fake.add_argument("--from-python", default=sys.executable)
    args = parser.parse_args(argv)
    if args.command == "select":
        kept = select(args.source, args.target)
        print(f"select: {len(kept)} wheels the machine lacks: {', '.join(wheel_name(w) for w in kept)}")
        return 0
    if args.command == "size":
        tree, wheels, fits = size(args.wheels, args.limit_mib)
        verdict = "fits" if fits else "is OVER the limit: carry fewer wheels or shrink the tree"
        print(f"size: the tree {tree:.1f} MiB + the wheels {wheels:.1f} MiB = {tree + wheels:.1f} MiB a call would "
              f"carry, of {args.limit_mib:.0f} MiB allowed: {verdict}", file=sys.stdout if fits else sys.stderr)
        return 0 if fits else 1
    print(fake_machine(args.dest, args.from_python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
