"""Mimi's audio frame: 24 kHz mono, 12.5 frames a second, so one frame (one LM step) is 1920 samples, 80 ms.

The only place these numbers are written: everything else imports them from here.
"""

from __future__ import annotations

SAMPLE_RATE = 24000
FRAME_SAMPLES = 1920
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
