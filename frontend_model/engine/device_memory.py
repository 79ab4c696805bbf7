"""Device memory: what a session's streaming state costs (computed from the model's layers, so the server, the
sizing in docs/operations.md and its test read one number), what the model holds now, and the CUDA calls that
place a thread on the model's device and give freed memory back.

On CUDA the in-use numbers come from torch's allocator; on CPU there is no such allocator, so they are the bytes of
the tensors the model holds (weights and streaming state), each storage counted once.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
from moshi.models.compression import MimiModel
from moshi.models.lm import LMModel
from moshi.modules.transformer import StreamingMultiheadAttention

from frontend_model.moshi_internals.streaming_state import streaming_modules, streaming_states

# Share of a device's memory that sessions and weights may take: the rest is the CUDA context, the allocator's
# slack and a tick's activations.
USABLE_SHARE = 0.9


@dataclass(frozen=True)
class SessionBytes:
    """Bytes of one session's KV caches, the streaming state that grows with the batch (the rest is kilobytes)."""

    temporal_kv: int
    depformer_kv: int
    mimi_kv: int

    @property
    def total(self) -> int:
        return self.temporal_kv + self.depformer_kv + self.mimi_kv


def ring_bytes(attn: StreamingMultiheadAttention, extra_frames: int = 0) -> int:
    """One row's K and V ring of a self-attention layer, as moshi allocates it (capacity `context`, or one slot per
    step for a depformer layer), plus `extra_frames` slots for a widened temporal ring."""
    capacity = attn.context if attn.context is not None else attn.weights_per_step
    heads = attn.num_heads // attn.kv_repeat
    dtype = attn.in_projs[0].weight.dtype
    return 2 * heads * (attn.embed_dim // attn.num_heads) * (capacity + extra_frames) * dtype.itemsize


def _self_attention(module: torch.nn.Module) -> list[StreamingMultiheadAttention]:
    return [m for m in module.modules() if isinstance(m, StreamingMultiheadAttention) and not m.cross_attention]


def session_bytes(lm: LMModel, mimi: MimiModel, max_span_frames: int) -> SessionBytes:
    """Per session: the temporal rings widened by `max_span_frames` (frontend_model.moshi_internals.kv_ring), the
    depformer's and
    Mimi's. Reads only layer shapes and dtypes, so a model built on the meta device sizes a GPU it was never on."""
    return SessionBytes(
        temporal_kv=sum(ring_bytes(a, max_span_frames) for a in _self_attention(lm.transformer)),
        depformer_kv=sum(ring_bytes(a) for a in _self_attention(lm.depformer)) if lm.depformer is not None else 0,
        mimi_kv=sum(ring_bytes(a) for a in _self_attention(mimi)),
    )


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the storages under `tensors`, each once: views (row_view's slices) share their batch's storage."""
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        # Meta tensors have no address: each counts whole (a meta model has no views).
        seen[id(t) if t.is_meta else storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def weight_bytes(*modules: torch.nn.Module) -> int:
    return _storage_bytes([t for m in modules for t in (*m.parameters(), *m.buffers())])


def streaming_bytes(*modules: torch.nn.Module) -> int:
    """Bytes of the streaming state the modules hold now (0 when not streaming)."""
    return _storage_bytes([t for state in streaming_states(modules) for t in state.tensors()])


def device_total_bytes(device: torch.device) -> int:
    """The device's memory: the GPU's, or the host's RAM for CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def free_bytes(device: torch.device) -> int:
    """What a new allocation can still get: the GPU's free memory, or the host's available RAM for CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    # MemAvailable counts the page cache the kernel would give back; free pages alone would not.
    with contextlib.suppress(OSError, StopIteration, ValueError), open("/proc/meminfo") as meminfo:
        return int(next(line for line in meminfo if line.startswith("MemAvailable:")).split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    in_use_bytes: int  # CUDA: allocated by torch; CPU: weights + streaming state, counted from the tensors
    reserved_bytes: int  # CUDA: held by torch's caching allocator; CPU: equal to in_use_bytes
    total_bytes: int
    weight_bytes: int
    session_bytes: int
    scratch_bytes: int  # the chunked prefill's scratch row (frontend_model/engine/chunked_prefill.py), 0 without one
    sessions_fit: int  # sessions whose state fits USABLE_SHARE of the device beside the weights and the scratch row

    def as_dict(self) -> dict[str, int | str]:
        return dict(vars(self))


def sessions_fit(total: int, weights: int, per_session: int) -> int:
    """The sizing rule docs/operations.md applies to an H200: (USABLE_SHARE x total - weights) / per session."""
    return max(0, int(total * USABLE_SHARE - weights) // per_session) if per_session > 0 else 0


def device_memory(lm: LMModel, mimi: MimiModel, per_session: int, scratch: int = 0) -> DeviceMemory:
    """What the model and its sessions hold on their device now, and how many sessions that device can hold;
    `scratch` the bytes of the span scratch row, held beside the batch."""
    device = next(lm.parameters()).device
    weights = weight_bytes(lm, mimi)
    if device.type == "cuda":
        in_use = int(torch.cuda.memory_allocated(device))
        reserved = int(torch.cuda.memory_reserved(device))
    else:
        in_use = reserved = weights + streaming_bytes(lm, mimi) + scratch
    total = device_total_bytes(device)
    return DeviceMemory(str(device), in_use, reserved, total, weights, per_session, scratch,
                        sessions_fit(total, weights + scratch, per_session))


def set_device(device: str | torch.device) -> None:
    """Make the calling thread's current CUDA device the model's: kernels, streams and the CUDA graphs recorded on
    this thread go to cuda:N, not cuda:0. Each thread has its own current device, so every thread that runs model
    code calls this (the loader, the model worker)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device} was asked for, but CUDA is not available to torch {torch.__version__}")
        torch.cuda.set_device(device.index)


def release_memory(device: torch.device) -> None:
    """Give the blocks torch's caching allocator keeps back to the device, so another load can use them."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def drop_streaming_state(*modules: torch.nn.Module) -> None:
    """Take every streaming state off the modules: after a failed `streaming()` (moshi leaves the layers it reached
    streaming) or for a model written off."""
    for root in modules:
        for module in streaming_modules(root):
            module._streaming_state = None


def release_model(lm: LMModel, mimi: MimiModel) -> None:
    """Free a written-off model's memory even while an abandoned thread still references its modules or their
    streaming state: every weight, buffer and state tensor is emptied in place, which frees its storage unless a
    call still running holds it as an operand (that memory comes back when the call returns). Whatever runs on this
    model afterwards fails."""
    device = next(lm.parameters()).device
    tensors: list[torch.Tensor] = []
    for root in (lm, mimi):
        tensors.extend((*root.parameters(), *root.buffers()))
    tensors.extend(t for state in streaming_states((lm, mimi)) for t in state.tensors())
    drop_streaming_state(lm, mimi)
    for t in tensors:
        t.data = torch.empty(0, dtype=t.dtype, device=t.device)
    release_memory(device)
