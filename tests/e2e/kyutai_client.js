// Speaks /api/chat as Kyutai's Moshi web client does (kyutai-labs/moshi client/src: useSocket.ts, encoder.ts,
// useUserAudio.ts, Conversation.tsx), for tests/e2e/test_browser.py: its query parameters, no JSON events, nothing
// sent before the 0x00 handshake, then Ogg Opus pages as opus-recorder streams them (encoderSampleRate 24000,
// encoderFrameSize 20 ms, maxFramesPerPage 2: the two header pages first, then two 20 ms packets a page), one
// page a message. Every message from the server goes through a copy of Kyutai's `decodeMessage`: a kind it would
// throw on is a failure here. Run by selenium's execute_async_script with (pcm24k as base64 float32, seeds,
// tail seconds, done callback).

const [pcmBase64, textSeed, audioSeed, tailS, done] = arguments;

// kyutai-labs/moshi client/src/protocol/encoder.ts decodeMessage, minus the payload parsing it does not need.
const CONTROL_ACTIONS = [0, 1, 2, 3]; // start, endTurn, pause, restart
function decodeMessage(data) {
  const type = data[0];
  const payload = data.slice(1);
  switch (type) {
    case 0x00: return { type: "handshake" };
    case 0x01: return { type: "audio", data: payload };
    case 0x02: return { type: "text", data: new TextDecoder().decode(payload) };
    case 0x07: return { type: "coloredtext", data: new TextDecoder().decode(payload.slice(1)) };
    case 0x03:
      if (!CONTROL_ACTIONS.includes(payload[0])) throw new Error("Unknown control message");
      return { type: "control" };
    case 0x04: return { type: "metadata", data: JSON.parse(new TextDecoder().decode(payload)) };
    case 0x05: return { type: "error", data: new TextDecoder().decode(payload) };
    case 0x06: return { type: "ping" };
    default: throw new Error(`Unknown message type ${type}`);
  }
}

// Ogg pages as opus-recorder writes them (RFC 7845; granule positions count 48 kHz samples).
const CRC_TABLE = new Uint32Array(256).map((_, i) => {
  let r = i << 24;
  for (let j = 0; j < 8; j++) r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
  return r >>> 0;
});
const serial = 0x4b797574;
let sequence = 0;
function page(packets, granule, flags) {
  const lacing = packets.flatMap((p) => [...Array(Math.floor(p.length / 255)).fill(255), p.length % 255]);
  const size = packets.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(27 + lacing.length + size);
  const view = new DataView(out.buffer);
  out.set([0x4f, 0x67, 0x67, 0x53, 0, flags]);
  view.setUint32(6, granule, true);
  view.setUint32(14, serial, true);
  view.setUint32(18, sequence++, true);
  out[26] = lacing.length;
  out.set(lacing, 27);
  let offset = 27 + lacing.length;
  for (const p of packets) { out.set(p, offset); offset += p.length; }
  let crc = 0;
  for (const b of out) crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ b) & 0xff]) >>> 0;
  view.setUint32(22, crc, true);
  return out;
}
function opusHead() {
  const head = new Uint8Array(19);
  head.set(new TextEncoder().encode("OpusHead"));
  const view = new DataView(head.buffer);
  head[8] = 1;
  head[9] = 1;
  view.setUint16(10, 3840, true); // opus-recorder's pre-skip
  view.setUint32(12, 24000, true);
  return head;
}
function opusTags() {
  const vendor = new TextEncoder().encode("opus-recorder-like");
  const tags = new Uint8Array(8 + 4 + vendor.length + 4);
  tags.set(new TextEncoder().encode("OpusTags"));
  new DataView(tags.buffer).setUint32(8, vendor.length, true);
  tags.set(vendor, 12);
  return tags;
}

async function encodePages(pcm) {
  const packets = [];
  const encoder = new AudioEncoder({
    output: (chunk) => { const b = new Uint8Array(chunk.byteLength); chunk.copyTo(b); packets.push(b); },
    error: (e) => { throw e; },
  });
  encoder.configure({ codec: "opus", sampleRate: 24000, numberOfChannels: 1, bitrate: 32000,
    opus: { frameDuration: 20000, complexity: 0 } });
  encoder.encode(new AudioData({ format: "f32-planar", sampleRate: 24000, numberOfFrames: pcm.length,
    numberOfChannels: 1, timestamp: 0, data: pcm }));
  await encoder.flush();
  encoder.close();
  const pages = [page([opusHead()], 0, 0x02), page([opusTags()], 0, 0)];
  for (let i = 0; i < packets.length; i += 2) {
    const two = packets.slice(i, i + 2);
    pages.push(page(two, 3840 + 960 * (i + two.length), 0));
  }
  return { pages, packets: packets.length };
}

async function run() {
  const bytes = Uint8Array.from(atob(pcmBase64), (c) => c.charCodeAt(0));
  const speech = new Float32Array(bytes.buffer);
  const pcm = new Float32Array(speech.length + Math.round(tailS * 24000));
  pcm.set(speech);
  const { pages, packets } = await encodePages(pcm);
  const result = { packets, pagesSent: 0, kinds: {}, thrown: [], audioBytes: 0, text: "", handshakeAt: null,
    closed: null };

  // Conversation.tsx buildURL; the defaults of useModelParams.ts, the seeds it draws.
  const url = new URL("/api/chat", location.href);
  url.protocol = "ws:";
  const params = { text_temperature: 0.7, text_topk: 25, audio_temperature: 0.8, audio_topk: 250, pad_mult: 0,
    text_seed: textSeed, audio_seed: audioSeed, repetition_penalty_context: 64, repetition_penalty: 1.0 };
  for (const [name, value] of Object.entries(params)) url.searchParams.append(name, value.toString());
  const ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  const finished = new Promise((resolve) => {
    ws.addEventListener("close", (e) => { result.closed = e.code; resolve(); });
  });

  const handshake = new Promise((resolve) => {
    ws.addEventListener("message", (e) => {
      let message;
      try {
        message = decodeMessage(new Uint8Array(e.data)); // a text message decodes as an empty array: it throws
      } catch (err) {
        result.thrown.push(`${err.message} (${typeof e.data === "string" ? "text message" : "binary"})`);
        return;
      }
      result.kinds[message.type] = (result.kinds[message.type] ?? 0) + 1;
      if (message.type === "handshake") { result.handshakeAt = performance.now(); resolve(); }
      if (message.type === "audio") result.audioBytes += message.data.length;
      if (message.type === "text") result.text += message.data;
    });
  });
  await Promise.race([handshake, finished]);
  if (result.handshakeAt !== null) {
    // Paced as a microphone: a page every 40 ms of audio, on an absolute schedule.
    const start = performance.now();
    for (let i = 0; i < pages.length && ws.readyState === WebSocket.OPEN; i++) {
      const due = start + Math.max(0, i - 2) * 40;
      await new Promise((r) => setTimeout(r, Math.max(0, due - performance.now())));
      ws.send(new Uint8Array([0x01, ...pages[i]]));
      result.pagesSent++;
    }
    ws.close();
    await finished;
  }
  return result;
}

run().then(done, (err) => done({ error: `${err.name}: ${err.message}` }));
