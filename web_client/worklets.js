// Audio worklets: `capture` hands the microphone to the page in 20 ms blocks; `player` is the jitter buffer.

class Capture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(Math.round(sampleRate * 0.02));
    this.filled = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (input) {
      let i = 0;
      while (i < input.length) {
        const n = Math.min(input.length - i, this.block.length - this.filled);
        this.block.set(input.subarray(i, i + n), this.filled);
        this.filled += n;
        i += n;
        if (this.filled === this.block.length) {
          this.port.postMessage(this.block.slice());
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

// A ring buffer that starts playing once `startMs` is buffered, goes back to buffering on underrun, and drops
// the oldest audio beyond `maxMs` so that latency stays bounded when the network bunches packets.
class Player extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ring = new Float32Array(sampleRate * 4);
    this.read = 0;
    this.write = 0;
    this.startSamples = Math.round(sampleRate * 0.12);
    this.maxSamples = Math.round(sampleRate * 0.6);
    this.playing = false;
    this.played = 0;
    this.underruns = 0;
    this.dropped = 0;
    this.lastReport = 0;
    this.port.onmessage = (e) => this.push(e.data);
  }

  get buffered() { return this.write - this.read; }

  push(samples) {
    for (let i = 0; i < samples.length; i++) this.ring[(this.write + i) % this.ring.length] = samples[i];
    this.write += samples.length;
    if (this.buffered > this.maxSamples) {
      const excess = this.buffered - this.startSamples;
      this.read += excess;
      this.dropped += excess;
    }
  }

  process(_, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.buffered >= this.startSamples) this.playing = true;
    if (this.playing) {
      const n = Math.min(out.length, this.buffered);
      for (let i = 0; i < n; i++) out[i] = this.ring[(this.read + i) % this.ring.length];
      this.read += n;
      this.played += n;
      if (n < out.length) { this.playing = false; this.underruns++; }
    }
    if (currentTime - this.lastReport > 0.25) {
      this.lastReport = currentTime;
      this.port.postMessage({
        playedS: this.played / sampleRate, bufferedMs: (1000 * this.buffered) / sampleRate,
        underruns: this.underruns, droppedS: this.dropped / sampleRate,
      });
    }
    return true;
  }
}

registerProcessor("capture", Capture);
registerProcessor("player", Player);
