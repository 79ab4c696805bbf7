"""The teacher: Whisper tiny.en's encoder states (the bundled model, offline), averaged to the codec's 12.5 Hz frames,
and one k-means codebook over them. Mimi's semantic codebook is distilled from WavLM in the same way; these codes tell
a question from a statement in 91 % of sentences never fitted on (`bench hear`), the random tiny codec's in 56 %."""

from __future__ import annotations

import numpy as np
import torch

from backend_agent.asr.resample import resample_24k_to_16k
from backend_agent.asr.transcriber import bundled_model_path
from frontend_model.frame import FRAME_SAMPLES

TEACHER_CODES = 256
STATES_PER_FRAME = 4  # Whisper's encoder states come at 50 Hz, the codec's frames at 12.5


class WhisperStates:
    """Whisper tiny.en's encoder, and the k-means codebook `fit` puts over its states."""

    def __init__(self, threads: int = 1) -> None:
        import ctranslate2
        from faster_whisper import WhisperModel
        from faster_whisper.feature_extractor import FeatureExtractor

        self._storage = ctranslate2.StorageView
        self._model = WhisperModel(bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=threads)
        self._features = FeatureExtractor(feature_size=80)
        self._window = self._features.nb_max_frames  # mel frames Whisper's encoder reads: 30 s
        self.centroids: torch.Tensor | None = None
        self.mean = self.std = torch.zeros(0)  # of the fitted states

    def states(self, pcm: np.ndarray) -> torch.Tensor:
        """[frames, width]: the encoder's states of 24 kHz `pcm` (whole frames of it), averaged over each frame."""
        mel = self._features(resample_24k_to_16k(pcm.astype(np.float32)))
        padded = np.zeros((mel.shape[0], self._window), np.float32)
        padded[:, :min(mel.shape[1], self._window)] = mel[:, :self._window]
        encoded = np.array(self._model.model.encode(self._storage.from_array(padded[None]), to_cpu=True))[0]
        frames = len(pcm) // FRAME_SAMPLES
        kept = encoded[:frames * STATES_PER_FRAME].reshape(frames, STATES_PER_FRAME, -1)
        return torch.from_numpy(kept.mean(1).astype(np.float32))

    def fit(self, states: list[torch.Tensor], seed: int, iterations: int = 20) -> None:
        x = torch.cat(states)
        self.mean, self.std = x.mean(0), x.std(0) + 1e-5
        self.centroids = kmeans((x - self.mean) / self.std, TEACHER_CODES, seed, iterations)

    def codes(self, states: torch.Tensor) -> torch.Tensor:
        """[frames]: each frame's nearest centroid."""
        assert self.centroids is not None, "fit first"
        return torch.cdist((states - self.mean) / self.std, self.centroids).argmin(1)


def kmeans(x: torch.Tensor, k: int, seed: int, iterations: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    centroids = x[torch.randperm(len(x), generator=generator)[:k]].clone()
    for _ in range(iterations):
        nearest = torch.cdist(x, centroids).argmin(1)
        sums = torch.zeros_like(centroids).index_add_(0, nearest, x)
        counts = torch.bincount(nearest, minlength=len(centroids))[:, None]
        centroids = torch.where(counts > 0, sums / counts.clamp(min=1), centroids)
    return centroids
