// Microphone -> Opus (WebCodecs AudioEncoder) -> Ogg pages, and server Ogg pages -> AudioDecoder -> jitter
// buffer. Opus runs at 48 kHz; the server's sphn reader and writer resample to and from its 24 kHz.

import { OggReader, OggWriter, opusHead, startsWith } from "./ogg.js";

const OPUS_RATE = 48000;

export function webCodecsSupported() {
  return typeof AudioEncoder !== "undefined" && typeof AudioDecoder !== "undefined";
}

/** Streaming linear resampler: good enough for speech, and keeps both ends at Opus' 48 kHz. */
class Resampler {
  constructor(from, to) {
    this.step = from / to;
    this.pos = 0;
    this.last = 0;
    this.identity = from === to;
  }

  process(input) {
    if (this.identity) return input;
    const out = [];
    while (this.pos < input.length) {
      const i = Math.floor(this.pos);
      const frac = this.pos - i;
      const a = i === 0 ? this.last : input[i - 1];
      const b = input[i];
      out.push(a + (b - a) * frac);
      this.pos += this.step;
    }
    this.pos -= input.length;
    this.last = input[input.length - 1];
    return Float32Array.from(out);
  }
}

export class Microphone {
  /** `onPage(bytes)` gets each Ogg page (the two header pages first, as one message). */
  constructor(context, onPage) {
    this.context = context;
    this.onPage = onPage;
    this.ogg = new OggWriter();
    this.resampler = new Resampler(context.sampleRate, OPUS_RATE);
    this.timestampUs = 0;
    this.sentHeaders = false;
    this.pages = 0;
  }

  async start() {
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    this.encoder = new AudioEncoder({
      output: (chunk) => this.onChunk(chunk),
      error: (e) => console.error("encoder", e),
    });
    this.encoder.configure({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: 1, bitrate: 32000 });
    this.source = this.context.createMediaStreamSource(this.stream);
    this.node = new AudioWorkletNode(this.context, "capture");
    this.node.port.onmessage = (e) => this.encode(this.resampler.process(e.data));
    this.source.connect(this.node);
  }

  encode(samples) {
    if (!samples.length || this.encoder.state !== "configured") return;
    const data = new AudioData({
      format: "f32-planar", sampleRate: OPUS_RATE, numberOfFrames: samples.length, numberOfChannels: 1,
      timestamp: this.timestampUs, data: samples,
    });
    this.timestampUs += (1e6 * samples.length) / OPUS_RATE;
    this.encoder.encode(data);
    data.close();
  }

  onChunk(chunk) {
    const packet = new Uint8Array(chunk.byteLength);
    chunk.copyTo(packet);
    const samples = Math.round(((chunk.duration || 20000) * OPUS_RATE) / 1e6);
    let page = this.ogg.packet(packet, samples);
    if (!this.sentHeaders) {
      const headers = this.ogg.headers();
      const both = new Uint8Array(headers.length + page.length);
      both.set(headers);
      both.set(page, headers.length);
      page = both;
      this.sentHeaders = true;
    }
    this.pages++;
    this.onPage(page);
  }

  /** A new Ogg stream, headers first, for a new socket: a resumed session's server reads a fresh stream. */
  reset() {
    this.ogg = new OggWriter();
    this.sentHeaders = false;
  }

  stop() {
    this.stream?.getTracks().forEach((t) => t.stop());
    this.source?.disconnect();
    this.node?.disconnect();
    if (this.encoder && this.encoder.state !== "closed") this.encoder.close();
  }
}

export class Speaker {
  constructor(context, onStats) {
    this.context = context;
    this.ogg = new OggReader();
    this.resampler = new Resampler(OPUS_RATE, context.sampleRate);
    this.timestampUs = 0;
    this.decoded = 0;
    this.node = new AudioWorkletNode(context, "player", { outputChannelCount: [1] });
    this.node.port.onmessage = (e) => onStats(e.data);
    this.node.connect(context.destination);
  }

  configure(head) {
    this.decoder = new AudioDecoder({
      output: (data) => this.onData(data),
      error: (e) => console.error("decoder", e),
    });
    this.decoder.configure({ codec: "opus", sampleRate: OPUS_RATE, numberOfChannels: 1, description: head });
  }

  /** Bytes of one 0x01 message: Ogg pages, possibly with the stream headers first. */
  push(bytes) {
    for (const packet of this.ogg.push(bytes)) {
      if (startsWith(packet, "OpusHead")) { this.configure(packet); continue; }
      if (startsWith(packet, "OpusTags")) continue;
      if (!this.decoder) this.configure(opusHead());
      this.decoder.decode(new EncodedAudioChunk({ type: "key", timestamp: this.timestampUs, data: packet }));
      this.timestampUs += 80000;
    }
  }

  /** A new socket sends a new Ogg stream (its headers first): the old decoder goes with the old stream. */
  reset() {
    this.ogg = new OggReader();
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
    this.decoder = undefined;
  }

  onData(data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: "f32-planar" });
    data.close();
    this.decoded += samples.length / OPUS_RATE;
    this.node.port.postMessage(this.resampler.process(samples));
  }

  stop() {
    this.node.disconnect();
    if (this.decoder && this.decoder.state !== "closed") this.decoder.close();
  }
}
