"""Streaming speech recognition: resampling, VAD segmentation and faster-whisper transcription."""
