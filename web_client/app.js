// The demo page: connects to /api/chat with JSON events on, streams the microphone, plays the agent back and
// shows both sides' text and the retrieval / span events as they happen.

import { Microphone, Speaker, webCodecsSupported } from "./audio.js";

const $ = (id) => document.getElementById(id);
const KIND = { handshake: 0, audio: 1, text: 2 };

// Counters the page shows, also read by the headless browser test.
const stats = (window.csStats = {
  state: "idle", handshake: false, pagesSent: 0, audioMessages: 0, textPieces: 0, decodedS: 0, playedS: 0,
  bufferedMs: 0, underruns: 0, serverP50Ms: null, deadlineMisses: 0, events: 0, error: null, sessionId: null,
  resumes: 0,
});

let session = null;

function setState(state, cls = "") {
  stats.state = state;
  $("state").textContent = state;
  $("state").className = `pill ${cls}`;
}

function showStats() {
  const rows = {
    "mic pages sent": stats.pagesSent, "agent audio msgs": stats.audioMessages,
    "agent audio played": `${stats.playedS.toFixed(2)} s`, "jitter buffer": `${stats.bufferedMs.toFixed(0)} ms`,
    underruns: stats.underruns, "server latency p50": stats.serverP50Ms === null ? "–" : `${stats.serverP50Ms} ms`,
    "deadline misses": stats.deadlineMisses,
  };
  $("stats").replaceChildren(...Object.entries(rows).flatMap(([k, v]) => {
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = v;
    return [dt, dd];
  }));
}

function addEvent(text, cls = "") {
  const li = document.createElement("li");
  li.textContent = text;
  li.className = cls;
  $("events").append(li);
  li.scrollIntoView({ block: "nearest" });
}

function onEvent(event) {
  stats.events++;
  switch (event.type) {
    case "session.ready":
      if (session) session.resume = event.resume ?? null;
      stats.sessionId = event.session_id;
      if (event.resumed_frames != null) {
        addEvent(`session ${event.session_id} resumed: ${event.resumed_frames} frames of history replayed in `
          + `${event.prefill_ms} ms`, "resumed");
        break;
      }
      if (event.recording) {
        $("wav").href = event.recording.wav;
        $("transcript").href = event.recording.transcript;
        $("downloads").hidden = false;
      }
      if (event.random_weights) $("random-warning").hidden = false;
      addEvent(`session ${event.session_id} ready: ${event.prefix_frames} persona frames prefilled in `
        + `${event.prefill_ms} ms (voice ${event.voice || "none"}; persona ${event.persona ? "\u201c" + event.persona
        + "\u201d" : "none"}); retrieval starts on `
        + (event.trigger === "ret" ? "the model's ⟨ret⟩" : "a question heard in your speech"));
      break;
    case "session.preparing": // a long persona / voice prefill: the handshake is still to come
      setState(`preparing: ${event.stage} ${Math.round(event.elapsed_s)} s`);
      break;
    case "session.updated":
      addEvent(`profile sent: ${Object.values(event.profile ?? {}).join(", ") || "(empty)"}`);
      break;
    case "user.transcript": {
      const user = $("user");
      if (user.classList.contains("muted")) { user.textContent = ""; user.classList.remove("muted"); }
      if (event.final) user.textContent += `${event.text}\n`;
      break;
    }
    case "retrieval": addEvent(`⟨ret⟩ at ${event.t.toFixed(2)} s: the model asks for facts`); break;
    case "question": addEvent(`question: “${event.text}”`); break;
    case "span.injected":
      addEvent(`span from ${event.source ?? "backend"}: “${event.text}” (${event.frames} frames, prefill `
        + `${event.prefill_ms} ms, ${event.latency_ms} ms after the request${event.truncated ? ", cut" : ""})`,
      "injected");
      break;
    case "span.dropped": addEvent(`span dropped (${event.reason}) after ${event.latency_ms} ms`, "dropped"); break;
    case "error": addEvent(`error ${event.code}: ${event.message}`, "error"); break;
    case "session.ending":
      addEvent(`the server ends this session in ${event.in_s} s (${event.reason.replace("_", " ")})`, "error");
      break;
    case "stats": {
      const sorted = [...event.latency_ms].sort((a, b) => a - b);
      if (sorted.length) stats.serverP50Ms = sorted[Math.floor(sorted.length / 2)].toFixed(1);
      stats.deadlineMisses += event.deadline_misses;
      break;
    }
    default: break;
  }
  showStats();
}

function chatUrl() {
  const url = new URL("/api/chat", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("events", "1");
  if ($("persona").value.trim()) url.searchParams.set("persona", $("persona").value.trim());
  if ($("voice").value) url.searchParams.set("voice", $("voice").value);
  return url;
}

function sessionUpdate() {
  const profile = {};
  for (const key of ["name", "location", "timezone"]) if ($(key).value.trim()) profile[key] = $(key).value.trim();
  const update = { type: "session.update", profile };
  if ($("notes").value.trim()) update.notes = $("notes").value.trim();
  return JSON.stringify(update);
}

// As contextspan_client resumes: after these closes the session goes on with its resume token (4000 carries a fresh
// one in its reason's message; the others use session.ready's), while the microphone and speaker keep running.
const RESUMABLE = new Set([4000, 1001, 1006, 1011]);
// While resuming, these may pass (a replica draining or loading, the old socket not yet closed on the server, a
// connection lost or refused): tried again after a growing pause, for up to RESUME_WITHIN_MS.
const RETRY = new Set([1001, 1006, 1013, 4409]);
const RESUME_WITHIN_MS = 60000;
const FIRST_PAUSE_MS = 250;
const MAX_PAUSE_MS = 4000;
// A second model fault (1011) this soon after resuming from one is the replayed history's own: resuming would loop.
const FAULT_AGAIN_MS = 10000;
const NOT_RESUMED = {
  4401: "not a resume token of this server", 4403: "the session belongs to another user",
  4404: "the server no longer keeps this session", 4410: "the session's resume token expired",
  4503: "this server cannot resume sessions now",
};

function closeReason(reason) {
  try {
    const data = JSON.parse(reason);
    return { error: data.error ?? "", message: data.message ?? "" };
  } catch { return { error: "", message: reason }; }
}

async function start() {
  $("start").disabled = true;
  $("stop").disabled = false;
  $("agent").textContent = "";
  $("events").replaceChildren();
  setState("connecting");
  const context = new AudioContext({ latencyHint: "interactive" });
  await context.audioWorklet.addModule("worklets.js");
  await context.resume();
  const speaker = new Speaker(context, (s) => {
    Object.assign(stats, s);
    stats.decodedS = speaker.decoded;
    showStats();
  });
  const s = { url: chatUrl(), ws: null, live: false, speaker, context, resume: null, resuming: null, timer: null };
  s.mic = new Microphone(context, (page) => {
    if (!s.live) return; // no socket to a session now: what is said while reconnecting is lost, as in a call
    const message = new Uint8Array(page.length + 1);
    message[0] = KIND.audio;
    message.set(page, 1);
    s.ws.send(message);
    stats.pagesSent++;
  });
  session = s;
  open(s, null);
}

/** A socket to the session: a new one (`token` null) or the resumed one, with the same persona and voice. */
function open(s, token) {
  const url = new URL(s.url);
  if (token) url.searchParams.set("resume", token);
  // A server with API keys wants a single-use session token; the operator's backend puts it in this page's URL.
  // A resume token stands in for it.
  const bearer = token ? null : new URLSearchParams(location.search).get("token");
  const ws = bearer ? new WebSocket(url, ["contextspan", `bearer.${bearer}`]) : new WebSocket(url);
  ws.binaryType = "arraybuffer";
  s.ws = ws;
  let handshake = false;
  ws.onmessage = async (e) => {
    if (typeof e.data === "string") { onEvent(JSON.parse(e.data)); return; }
    const bytes = new Uint8Array(e.data);
    const payload = bytes.subarray(1);
    if (bytes[0] === KIND.handshake) {
      handshake = stats.handshake = true;
      setState("live", "live");
      if (token) {
        s.resuming = null;
        stats.resumes++;
        s.mic.reset(); // the resumed session reads a new Ogg stream, headers first
        s.live = true;
        return;
      }
      s.live = true;
      ws.send(sessionUpdate());
      try { await s.mic.start(); } catch (err) { fail(`microphone: ${err.message}`); }
    } else if (bytes[0] === KIND.audio) {
      stats.audioMessages++;
      s.speaker.push(payload);
    } else if (bytes[0] === KIND.text) {
      stats.textPieces++;
      $("agent").textContent += new TextDecoder().decode(payload);
      $("agent").scrollTop = $("agent").scrollHeight;
    }
  };
  ws.onclose = (e) => {
    if (session !== s || s.ws !== ws) return; // stopped, or a socket already replaced
    s.live = false;
    const { error, message } = closeReason(e.reason);
    if (handshake && RESUMABLE.has(e.code)) {
      const fresh = e.code === 4000 ? message : s.resume;
      const now = Date.now();
      const faultAgain = e.code === 1011 && s.faultResumedAt && now - s.faultResumedAt < FAULT_AGAIN_MS;
      if (fresh && !faultAgain) {
        if (e.code === 1011) s.faultResumedAt = now;
        s.resuming = { token: fresh, deadline: now + RESUME_WITHIN_MS, pause: FIRST_PAUSE_MS };
        setState("reconnecting", "reconnecting");
        addEvent(`connection closed (${e.code}${error ? ` ${error}` : ""}): resuming the session`);
        s.speaker.reset(); // the next socket brings a new Ogg stream
        open(s, fresh);
        return;
      }
    } else if (s.resuming && !handshake && RETRY.has(e.code)) {
      const wait = s.resuming.pause * (0.5 + Math.random() / 2); // jittered: a drained replica's calls spread out
      if (Date.now() + wait < s.resuming.deadline) {
        s.resuming.pause = Math.min(s.resuming.pause * 2, MAX_PAUSE_MS);
        s.timer = setTimeout(() => { if (session === s) open(s, s.resuming.token); }, wait);
        return;
      }
      fail(`the session could not be resumed within ${RESUME_WITHIN_MS / 1000} s (last close ${e.code})`);
      teardown();
      return;
    }
    if (s.resuming && NOT_RESUMED[e.code]) {
      fail(`the session cannot be resumed: ${NOT_RESUMED[e.code]} (${e.code}); start a new one`);
    } else if (e.code === 1006 && !handshake && !s.resuming) {
      // Browsers hide the HTTP answer of a refused upgrade: name the likely causes.
      fail(new URLSearchParams(location.search).get("token")
        ? "refused: the session token is unknown, used or expired (tokens open one session)"
        : "refused: this server may need a session token (?token=) or a different origin");
    } else if (e.code !== 1000 && e.code !== 1005) {
      fail(`closed ${e.code}${message ? `: ${message}` : ""}`);
    } else if (stats.state !== "error") {
      setState("stopped");
    }
    teardown();
  };
}

function fail(message) {
  stats.error = message;
  setState("error", "error");
  addEvent(message, "error");
}

function teardown() {
  if (!session) return;
  const { ws, mic, speaker, context, timer } = session;
  session = null;
  clearTimeout(timer);
  mic.stop();
  speaker.stop();
  if (ws.readyState <= WebSocket.OPEN) ws.close(1000); // a resume still connecting, too
  context.close();
  $("start").disabled = false;
  $("stop").disabled = true;
}

async function init() {
  showStats();
  if (!webCodecsSupported()) {
    $("support-warning").hidden = false;
    $("start").disabled = true;
  }
  $("timezone").value = Intl.DateTimeFormat().resolvedOptions().timeZone;
  $("start").onclick = () => start().catch((err) => { fail(err.message); teardown(); });
  $("stop").onclick = () => { setState("stopped"); teardown(); };
  try {
    const info = await (await fetch("/api/info")).json();
    $("model").textContent = info.loaded ? info.description : `model loading… ${info.load_error ?? ""}`;
    $("random-warning").hidden = !info.random_weights;
    $("trained-hint").hidden = info.profile !== "tiny-contextspan-trained";
    for (const voice of info.voices) $("voice").append(new Option(voice, voice));
  } catch (err) {
    $("model").textContent = `server unreachable: ${err.message}`;
  }
}

init();
