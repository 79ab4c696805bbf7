"""Speech for benchmarks and tests that need a spoken question: espeak-ng, read back at the model's rate."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from contextspan_client import load_wav


def speak(text: str, wav: Path) -> np.ndarray:
    """espeak-ng says `text` into `wav`; returns it as 24 kHz mono float32."""
    subprocess.run(["espeak-ng", "-w", str(wav), text], check=True)
    return load_wav(str(wav))
