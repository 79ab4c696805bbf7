// Ogg framing for Opus (RFC 7845), enough for one mono stream each way: a page writer for the microphone
// and a demuxer for the server's pages. WebCodecs gives raw Opus packets; the Moshi wire wants Ogg pages.

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
    table[i] = r >>> 0;
  }
  return table;
})();

function crc32(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  return crc >>> 0;
}

export const PRE_SKIP = 312;

export function opusHead(channels = 1, inputRate = 48000) {
  const head = new Uint8Array(19);
  head.set(new TextEncoder().encode("OpusHead"));
  const view = new DataView(head.buffer);
  head[8] = 1;
  head[9] = channels;
  view.setUint16(10, PRE_SKIP, true);
  view.setUint32(12, inputRate, true);
  return head;
}

function opusTags() {
  const vendor = new TextEncoder().encode("contextspan-web");
  const tags = new Uint8Array(8 + 4 + vendor.length + 4);
  tags.set(new TextEncoder().encode("OpusTags"));
  new DataView(tags.buffer).setUint32(8, vendor.length, true);
  tags.set(vendor, 12);
  return tags;
}

export class OggWriter {
  constructor() {
    this.serial = (Math.random() * 0xffffffff) >>> 0;
    this.sequence = 0;
    this.granule = PRE_SKIP;
  }

  /** The two header pages, to send before the first audio page. */
  headers() {
    return concat([this.page(opusHead(), 0, 0x02), this.page(opusTags(), 0, 0)]);
  }

  /** One Opus packet of `samples48k` samples -> one Ogg page. */
  packet(data, samples48k) {
    this.granule += samples48k;
    return this.page(data, this.granule, 0);
  }

  page(data, granule, flags) {
    const segments = [];
    let left = data.length;
    while (left >= 255) { segments.push(255); left -= 255; }
    segments.push(left);
    const page = new Uint8Array(27 + segments.length + data.length);
    const view = new DataView(page.buffer);
    page.set([0x4f, 0x67, 0x67, 0x53]); // OggS
    page[5] = flags;
    view.setUint32(6, granule % 0x100000000, true);
    view.setUint32(10, Math.floor(granule / 0x100000000), true);
    view.setUint32(14, this.serial, true);
    view.setUint32(18, this.sequence++, true);
    page[26] = segments.length;
    page.set(segments, 27);
    page.set(data, 27 + segments.length);
    view.setUint32(22, crc32(page), true);
    return page;
  }
}

/** Splits a byte stream of Ogg pages (in any chunking) into packets. */
export class OggReader {
  constructor() {
    this.buffer = new Uint8Array(0);
    this.partial = [];
  }

  push(bytes) {
    this.buffer = concat([this.buffer, bytes]);
    const packets = [];
    for (;;) {
      const b = this.buffer;
      if (b.length < 27) break;
      if (b[0] !== 0x4f || b[1] !== 0x67 || b[2] !== 0x67 || b[3] !== 0x53) {
        // Lost sync: skip to the next capture pattern.
        const next = findOggS(b, 1);
        this.buffer = next < 0 ? new Uint8Array(0) : b.subarray(next);
        this.partial = [];
        continue;
      }
      const nseg = b[26];
      if (b.length < 27 + nseg) break;
      const lacing = b.subarray(27, 27 + nseg);
      const bodyLen = lacing.reduce((a, v) => a + v, 0);
      const total = 27 + nseg + bodyLen;
      if (b.length < total) break;
      if (!(b[5] & 0x01)) this.partial = [];
      let offset = 27 + nseg;
      for (const len of lacing) {
        this.partial.push(b.subarray(offset, offset + len));
        offset += len;
        if (len < 255) {
          packets.push(concat(this.partial));
          this.partial = [];
        }
      }
      this.buffer = b.slice(total);
    }
    return packets;
  }
}

function findOggS(b, from) {
  for (let i = from; i + 3 < b.length; i++) {
    if (b[i] === 0x4f && b[i + 1] === 0x67 && b[i + 2] === 0x67 && b[i + 3] === 0x53) return i;
  }
  return -1;
}

export function concat(parts) {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let offset = 0;
  for (const p of parts) { out.set(p, offset); offset += p.length; }
  return out;
}

export function startsWith(bytes, text) {
  const magic = new TextEncoder().encode(text);
  return bytes.length >= magic.length && magic.every((v, i) => bytes[i] === v);
}
