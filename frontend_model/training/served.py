"""The user's audio as serving feeds it to the model: a microphone's room (digital silence or a noise floor), an Ogg
Opus round trip at 24 kHz (the client's encoder, the server's decoder) and the server's `UserLeveller`, frame by
frame from the session's start.

A noise profile is one such condition. Its rooms are generated here (seeded: coloured noise and a mains hum), not the
frozen test set's: a -57 LUFS room, levelled up by as much as 30 dB, reaches the model at about -27 LUFS, and a model
that only heard digital zeros between words asked in it. Every profile renders the same way through the serving
code (imported, not copied), so training hears what a session hears.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sphn

from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from server.wire.leveller import UserLeveller


@dataclass(frozen=True)
class NoiseProfile:
    """A room: noise at `rms` (0: digital silence) whose power falls as 1/f**`colour` (0 hiss, 1 pink, 2 brown),
    with a mains hum of `hum` amplitude at `hum_hz`."""

    name: str
    rms: float = 0.0
    colour: float = 1.0
    hum: float = 0.0
    hum_hz: float = 50.0


# Digital silence, and rooms from a faint hiss to a loud air-conditioned room (about -66 to -40 dBFS RMS).
PROFILES = (
    NoiseProfile("digital"),
    NoiseProfile("hiss", rms=0.0005, colour=0.0),
    NoiseProfile("pink", rms=0.0015, colour=1.0),
    NoiseProfile("pink-hum", rms=0.003, colour=1.0, hum=0.001, hum_hz=50.0),
    NoiseProfile("brown-hum", rms=0.006, colour=2.0, hum=0.002, hum_hz=60.0),
    NoiseProfile("loud-pink", rms=0.01, colour=1.0),
)


def room(profile: NoiseProfile, samples: int, rng: np.random.Generator) -> np.ndarray:
    """`samples` of the profile's room noise, float32."""
    if profile.rms <= 0 or samples <= 0:
        return np.zeros(max(samples, 0), np.float32)
    spectrum = np.fft.rfft(rng.standard_normal(samples))
    spectrum /= np.maximum(np.fft.rfftfreq(samples, 1 / SAMPLE_RATE), 20.0) ** (profile.colour / 2)
    noise = np.fft.irfft(spectrum, samples)
    noise *= profile.rms / max(float(np.sqrt(np.mean(noise**2))), 1e-12)
    if profile.hum:
        phase = rng.uniform(0, 2 * np.pi)
        noise += profile.hum * np.sin(2 * np.pi * profile.hum_hz * np.arange(samples) / SAMPLE_RATE + phase)
    return noise.astype(np.float32)


def as_served(pcm: np.ndarray) -> np.ndarray:
    """A session's microphone PCM (from its start, whole frames) as the model's codec receives it: Ogg Opus encoded
    in 80 ms frames as the client sends it (sphn's writer) and decoded as the server decodes it (sphn's reader, under
    `server.wire.opus.OpusDecoder`'s checks, which a well-formed stream passes unchanged), then levelled."""
    frames = len(pcm) // FRAME_SAMPLES
    writer, reader, leveller = sphn.OpusStreamWriter(SAMPLE_RATE), sphn.OpusStreamReader(SAMPLE_RATE), UserLeveller()
    decoded = [np.asarray(reader.append_bytes(writer.append_pcm(np.ascontiguousarray(
        pcm[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES], dtype=np.float32))), dtype=np.float32).reshape(-1)
        for i in range(frames)]
    stream = np.concatenate([np.zeros(0, np.float32), *decoded])
    stream = np.pad(stream, (0, max(0, frames * FRAME_SAMPLES - len(stream))))[:frames * FRAME_SAMPLES]
    return np.concatenate([np.zeros(0, np.float32),
                           *(leveller.process(stream[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES])
                             for i in range(frames))]).astype(np.float32)


def session(profile: NoiseProfile, speech: np.ndarray | None, lead_frames: int, frames: int,
            rng: np.random.Generator) -> np.ndarray:
    """`frames` frames of a session in `profile`'s room, as served: `speech` (if any) said over the room from frame
    `lead_frames` on."""
    pcm = room(profile, frames * FRAME_SAMPLES, rng)
    if speech is not None:
        start = lead_frames * FRAME_SAMPLES
        said = speech[: max(0, len(pcm) - start)]
        pcm[start:start + len(said)] += said
    return as_served(np.clip(pcm, -1.0, 1.0))
