"use strict";
(function () {
  const tokenKey = "broadcast-token";
  const $ = (id) => document.getElementById(id);
  const history = {};        // output name -> [bits per second], one a second, the last minute
  let lastEventId = null;
  let previewTimer = null;
  let previewURL = null;
  let streamAbort = null;

  // The token: from the fragment (never sent to the server, dropped from the address bar at
  // once), else what this tab was given before. `#login=CODE` (broadcast ui --open) is a
  // one-time code, exchanged here for the token (POST /v1/login); null: nothing in the
  // fragment, else what to say if no token came of it.
  async function takeFragment() {
    const fragment = new URLSearchParams(location.hash.slice(1));
    if (!fragment.has("token") && !fragment.has("login")) return null;
    window.history.replaceState(null, "", location.pathname + location.search);
    if (fragment.has("token")) {
      sessionStorage.setItem(tokenKey, fragment.get("token"));
      return "";
    }
    try {
      const response = await fetch("/v1/login", { method: "POST", body: fragment.get("login"), cache: "no-store" });
      const answer = await response.json();
      if (response.ok && answer.token) {
        sessionStorage.setItem(tokenKey, answer.token);
        return "";
      }
      return "The login code was refused: " + (answer.error || response.status);
    } catch (error) {
      return "The login code could not be used: " + error.message;
    }
  }
  async function start(onHashChange) {
    const said = await takeFragment();
    if (onHashChange && said === null) return;
    if (said && !token()) { showLogin(said); return; }
    open();
  }
  window.addEventListener("hashchange", () => start(true));
  const token = () => sessionStorage.getItem(tokenKey);
  const headers = (extra) => {
    const h = Object.assign({}, extra || {});
    if (token()) h["Authorization"] = "Bearer " + token();
    return h;
  };

  function showLogin(message) {
    $("main").hidden = true;
    $("login").hidden = false;
    $("login-message").textContent = message;
  }

  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(tokenKey, $("token-input").value.trim());
    $("token-input").value = "";
    open();
  });

  async function open() {
    let response;
    try {
      response = await fetch("/v1/status", { headers: headers(), cache: "no-store" });
    } catch (error) {
      showLogin("The daemon cannot be reached: " + error.message);
      return;
    }
    if (response.status === 401) {
      const had = token();
      sessionStorage.removeItem(tokenKey);
      showLogin(had ? "That token was refused. Enter the control listener's token." : "This control listener needs its token.");
      return;
    }
    $("login").hidden = true;
    $("main").hidden = false;
    render(await response.json(), false);
    follow();
    startPreview();
  }

  // ---- the event stream, read with fetch (EventSource cannot send a header)
  async function follow() {
    if (streamAbort) streamAbort.abort();
    const abort = new AbortController();
    streamAbort = abort;
    const h = headers({ "Accept": "text/event-stream" });
    if (lastEventId) h["Last-Event-ID"] = lastEventId;
    try {
      // levels=1: the audio meters' `levels` and the once-a-second `status` too.
      const response = await fetch("/v1/events?levels=1", { headers: h, cache: "no-store", signal: abort.signal });
      if (response.status === 401) { showLogin("The token was refused."); return; }
      if (!response.ok || !response.body) throw new Error("HTTP " + response.status);
      $("connection").textContent = "live updates";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          handleBlock(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
        }
      }
    } catch (error) {
      if (abort.signal.aborted) return;
    }
    if (abort.signal.aborted) return;
    $("connection").textContent = "reconnecting\u2026";
    setTimeout(follow, 1000);
  }

  function handleBlock(block) {
    let type = "message", data = "", id = null;
    for (const line of block.split("\n")) {
      if (line.startsWith("event: ")) type = line.slice(7);
      else if (line.startsWith("data: ")) data += line.slice(6);
      else if (line.startsWith("id: ")) id = line.slice(4);
    }
    if (id) lastEventId = id;
    let fields;
    try { fields = JSON.parse(data); } catch (e) { return; }
    switch (type) {
      case "state":
        render(fields.status, false);
        break;
      case "status":
        render(fields.status);
        break;
      case "levels":
        meters(fields.meters || []);
        break;
      case "dropped":
        log(type, fields);
        break;
      default:
        log(type, fields);
        if (type === "output") setOutputState(fields.name, fields.state);
        if (type === "broadcast") setState($("broadcast-state"), fields.state === "resumed" ? "started" : fields.state);
    }
  }

  // ---- rendering
  const seconds = (s) => {
    if (s == null) return "\u2013";
    s = Math.floor(s);
    const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60, r = s % 60;
    return (h ? h + ":" : "") + String(m).padStart(h ? 2 : 1, "0") + ":" + String(r).padStart(2, "0");
  };
  const bits = (b) => b == null ? "\u2013" : b >= 1e6 ? (b / 1e6).toFixed(2) + " Mb/s" : (b / 1e3).toFixed(0) + " kb/s";
  const bytes = (b) => b == null ? "\u2013" : b >= 1 << 30 ? (b / (1 << 30)).toFixed(1) + " GiB" : (b / (1 << 20)).toFixed(1) + " MiB";

  function setState(element, state) {
    element.textContent = state;
    element.dataset.state = state;
  }

  // `sample`: a point for the bitrate graphs (the once-a-second `status` events); an
  // action's answer only updates the figures.
  function render(status, sample = true) {
    if (!status) return;
    setState($("broadcast-state"), status.state);
    $("uptime").textContent = seconds(status.uptime_seconds);
    $("media").textContent = seconds(status.media_seconds);
    $("fps").textContent = status.fps == null ? "\u2013" : status.fps + " fps";
    $("bitrate").textContent = bits(status.bitrate);
    const memory = status.memory || {};
    const resident = memory.resident_bytes, budget = memory.budget_bytes;
    $("memory").textContent = bytes(resident) + (budget ? " of " + bytes(budget) + " budget" : "");
    outputs(status.outputs || [], sample);
    encodes(status.encodes || []);
    sources(status.types || {}, status.layers || []);
    scenes(status.scenes || [], status.scene);
    audioSources(status.audio || {});
  }

  // A button per scene, the current one pressed.
  function scenes(list, current) {
    const box = $("scene-buttons");
    $("scenes").hidden = list.length === 0;
    const names = Array.from(box.children).map((b) => b.dataset.scene);
    if (names.join("\n") !== list.join("\n")) {
      box.textContent = "";
      for (const name of list) {
        const button = document.createElement("button");
        button.textContent = name;
        button.dataset.scene = name;
        button.addEventListener("click", () => act("/v1/scene/" + encodeURIComponent(name)));
        box.append(button);
      }
    }
    for (const button of box.children) {
      const on = button.dataset.scene === current;
      button.setAttribute("aria-pressed", String(on));
      button.classList.toggle("current", on);
    }
  }

  // Per audio source ("mic", "app"): mute and volume, as the API has them.
  const sourceTitles = { mic: "Microphone", app: "Desktop audio" };
  function audioSources(audio) {
    const box = $("audio-sources");
    for (const [name, level] of Object.entries(audio)) {
      let row = box.querySelector('[data-source="' + CSS.escape(name) + '"]');
      if (!row) {
        row = document.createElement("div");
        row.className = "audio-source";
        row.dataset.source = name;
        const label = document.createElement("span");
        label.className = "label";
        label.textContent = sourceTitles[name] || name;
        const mute = document.createElement("button");
        mute.className = "mute";
        mute.addEventListener("click", () =>
          act("/v1/audio/" + encodeURIComponent(name) + "/" + (row.dataset.muted === "true" ? "unmute" : "mute")));
        const volume = document.createElement("input");
        volume.type = "range";
        volume.className = "volume";
        volume.min = "-60";
        volume.max = "20";
        volume.step = "1";
        volume.setAttribute("aria-label", (sourceTitles[name] || name) + " volume in dB");
        const shown = document.createElement("span");
        shown.className = "volume-text";
        volume.addEventListener("input", () => { shown.textContent = volume.value + " dB"; });
        volume.addEventListener("change", () => {
          row.dataset.editing = "";
          act("/v1/audio/" + encodeURIComponent(name) + "/volume?db=" + encodeURIComponent(volume.value));
        });
        volume.addEventListener("pointerdown", () => { row.dataset.editing = "true"; });
        row.append(label, mute, volume, shown);
        box.append(row);
      }
      row.dataset.muted = String(!!level.muted);
      const mute = row.querySelector(".mute");
      mute.textContent = level.muted ? "Unmute" : "Mute";
      mute.setAttribute("aria-pressed", String(!!level.muted));
      if (row.dataset.editing !== "true") {
        row.querySelector(".volume").value = String(level.volume_db);
        row.querySelector(".volume-text").textContent = level.volume_db + " dB";
      }
    }
    for (const row of Array.from(box.children)) {
      if (!(row.dataset.source in audio)) row.remove();
    }
  }

  function outputState(o) { return o.paused ? "paused" : o.state; }

  function outputs(list, sample) {
    const box = $("outputs");
    const seen = new Set();
    for (const o of list) {
      seen.add(o.name);
      let card = box.querySelector('[data-output="' + CSS.escape(o.name) + '"]');
      if (!card) card = makeOutput(box, o);
      setState(card.querySelector(".state"), outputState(o));
      card.querySelector(".kind").textContent = o.kind;
      const values = {
        target: o.target, bitrate: bits(o.bitrate), backlog: o.backlog_ms + " ms", reconnects: o.reconnects,
        drops: Object.entries(o.drops || {}).filter(([, n]) => n > 0).map(([r, n]) => n + " " + r).join(", ") || "none",
        error: o.error || "none",
      };
      if (o.target_bitrate != null) values.adapting = bits(o.target_bitrate) + " of " + bits(o.max_bitrate);
      if (o.kind === "replay") {
        values.buffered = (o.buffered_seconds ?? 0).toFixed(1) + " s of " + o.replay_seconds + " s";
        values.saves = (o.saves_done ?? 0) + " saved, " + (o.saves_failed ?? 0) + " failed" + (o.last_saved_path ? ", last " + o.last_saved_path : "");
      }
      for (const [key, value] of Object.entries(values)) {
        let dd = card.querySelector('dd[data-key="' + key + '"]');
        if (!dd) {
          const dt = document.createElement("dt");
          dt.textContent = key;
          dd = document.createElement("dd");
          dd.dataset.key = key;
          card.querySelector("dl").append(dt, dd);
        }
        dd.textContent = value;
      }
      card.querySelector(".pause").textContent = o.paused ? "Resume " + o.name : "Pause " + o.name;
      const series = history[o.name] || (history[o.name] = []);
      if (sample || series.length === 0) series.push(o.bitrate || 0);
      if (series.length > 60) series.splice(0, series.length - 60);
      graph(card.querySelector("canvas"), series);
    }
    for (const card of Array.from(box.children)) if (!seen.has(card.dataset.output)) card.remove();
  }

  // Each video encode: the broadcast's first, then the outputs' own, with the outputs it feeds.
  function encodes(list) {
    const body = $("encodes").querySelector("tbody");
    body.replaceChildren(...list.map(e => {
      const row = document.createElement("tr");
      row.dataset.encode = e.size + " " + (e.outputs || []).join(",");
      for (const text of [e.size, e.rate_control + " " + bits(e.video_bitrate) + ", " + e.fps + " fps", bits(e.bitrate), (e.outputs || []).join(", ")]) {
        const cell = document.createElement("td");
        cell.textContent = text;
        row.append(cell);
      }
      return row;
    }));
  }

  function makeOutput(box, o) {
    const card = document.createElement("div");
    card.className = "output";
    card.dataset.output = o.name;
    const title = document.createElement("div");
    title.className = "title";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = o.name;
    const kind = document.createElement("span");
    kind.className = "kind muted";
    const state = document.createElement("span");
    state.className = "state";
    title.append(name, kind, state);
    const pause = document.createElement("button");
    pause.className = "pause";
    pause.addEventListener("click", () => {
      const paused = card.querySelector(".state").dataset.state === "paused";
      act("/v1/outputs/" + encodeURIComponent(o.name) + (paused ? "/resume" : "/pause"));
    });
    const buttons = document.createElement("div");
    buttons.append(pause);
    if (o.kind === "replay") {
      const save = document.createElement("button");
      save.className = "save";
      save.textContent = "Save " + o.name;
      save.addEventListener("click", () => act("/v1/outputs/" + encodeURIComponent(o.name) + "/save"));
      buttons.append(save);
    }
    const canvas = document.createElement("canvas");
    canvas.width = 300;
    canvas.height = 48;
    canvas.setAttribute("aria-label", "bitrate of " + o.name + " over the last minute");
    card.append(title, buttons, document.createElement("dl"), canvas);
    box.append(card);
    return card;
  }

  function setOutputState(name, state) {
    const card = $("outputs").querySelector('[data-output="' + CSS.escape(name) + '"]');
    if (card) {
      setState(card.querySelector(".state"), state);
      card.querySelector(".pause").textContent = (state === "paused" ? "Resume " : "Pause ") + name;
    }
  }

  function graph(canvas, series) {
    // Drawn at the canvas's size on screen (no stretched text).
    const scale = window.devicePixelRatio || 1;
    const cw = Math.max(1, Math.round(canvas.clientWidth * scale)), ch = Math.max(1, Math.round(canvas.clientHeight * scale));
    if (canvas.width !== cw || canvas.height !== ch) { canvas.width = cw; canvas.height = ch; }
    const c = canvas.getContext("2d");
    c.setTransform(scale, 0, 0, scale, 0, 0);
    const w = canvas.clientWidth, h = canvas.clientHeight;
    c.clearRect(0, 0, w, h);
    const max = Math.max(1, ...series);
    c.strokeStyle = getComputedStyle(document.body).color;
    c.lineWidth = 1.5;
    c.beginPath();
    series.forEach((v, i) => {
      const x = w - (series.length - 1 - i) * (w / 59), y = h - 2 - (v / max) * (h - 4);
      if (i === 0) c.moveTo(x, y); else c.lineTo(x, y);
    });
    c.stroke();
    c.fillStyle = c.strokeStyle;
    c.font = "10px sans-serif";
    c.fillText(bits(max) + " max, last minute", 4, 11);
  }

  function sources(types, layers) {
    const body = $("sources").querySelector("tbody");
    body.textContent = "";
    for (const l of layers) {
      const row = document.createElement("tr");
      row.dataset.layer = String(l.index);
      const state = document.createElement("span");
      state.className = "state";
      setState(state, l.source_state);
      const cells = ["layer " + l.index + ": " + l.name + " (" + l.shown + ")", state, String(l.device_losses), "\u2013", String(l.dropped)];
      for (const cell of cells) {
        const td = document.createElement("td");
        td.append(cell);
        row.append(td);
      }
      body.append(row);
    }
    for (const [type, s] of Object.entries(types)) {
      const row = document.createElement("tr");
      row.dataset.type = type;
      const state = document.createElement("span");
      state.className = "state";
      setState(state, s.source_state);
      const dropped = Object.values(s.dropped || {}).reduce((a, b) => a + b, 0);
      const cells = [type, state, String(s.device_losses), String(s.delivered), String(dropped)];
      for (const cell of cells) {
        const td = document.createElement("td");
        td.append(cell);
        row.append(td);
      }
      body.append(row);
    }
  }

  function meters(list) {
    const box = $("meters");
    if (list.length && box.querySelector("p")) box.textContent = "";
    for (const m of list) {
      let meter = box.querySelector('[data-meter="' + CSS.escape(m.name) + '"]');
      if (!meter) {
        meter = document.createElement("div");
        meter.className = "meter";
        meter.dataset.meter = m.name;
        const label = document.createElement("div");
        label.className = "text";
        const bar = document.createElement("div");
        bar.className = "bar";
        bar.setAttribute("role", "meter");
        bar.setAttribute("aria-valuemin", "-60");
        bar.setAttribute("aria-valuemax", "0");
        const rms = document.createElement("div");
        rms.className = "rms";
        const peak = document.createElement("div");
        peak.className = "peak";
        bar.append(rms, peak);
        meter.append(label, bar);
        box.append(meter);
      }
      const position = (db) => Math.max(0, Math.min(100, (db + 60) / 60 * 100));
      meter.querySelector(".rms").style.width = position(m.rms_dbfs) + "%";
      meter.querySelector(".peak").style.left = "calc(" + position(m.peak_dbfs) + "% - 3px)";
      meter.querySelector(".bar").setAttribute("aria-valuenow", String(m.rms_dbfs));
      meter.dataset.peak = m.peak_dbfs;
      meter.dataset.rms = m.rms_dbfs;
      meter.dataset.title = m.title || m.name;
      meter.querySelector(".text").textContent =
        (m.title || m.name) + ": peak " + m.peak_dbfs.toFixed(1) + " dBFS, RMS " + m.rms_dbfs.toFixed(1) + " dBFS";
    }
  }

  function log(type, fields) {
    const item = document.createElement("li");
    const text = Object.entries(fields).filter(([k]) => k !== "time").map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
    item.textContent = (fields.time || "").replace("T", " ").replace("Z", "") + " " + type + " " + text;
    const list = $("log");
    list.prepend(item);
    while (list.children.length > 100) list.lastChild.remove();
  }

  // ---- actions: the answer (or the error, for a reload the config's FILE:LINE: key: message) is shown
  async function act(path) {
    const answer = $("answer");
    answer.textContent = "POST " + path + " \u2026";
    try {
      const response = await fetch(path, { method: "POST", headers: headers(), cache: "no-store" });
      const text = await response.text();
      let body = null;
      try { body = JSON.parse(text); } catch (e) { body = null; }
      answer.dataset.ok = String(response.ok);
      if (!response.ok) {
        answer.textContent = "POST " + path + ": " + response.status + ": " + (body && body.error ? body.error : text);
      } else if (path === "/v1/reload") {
        answer.textContent = "reload: applies " + body.applies + "\n" + JSON.stringify(body, null, 1);
      } else if (body && body.path) {
        answer.textContent = "POST " + path + ": saving " + body.path;
      } else {
        answer.textContent = "POST " + path + ": done";
        if (body && body.state) render(body, false);
      }
    } catch (error) {
      answer.dataset.ok = "false";
      answer.textContent = "POST " + path + ": " + error.message;
    }
  }
  for (const button of document.querySelectorAll(".controls button")) {
    button.addEventListener("click", () => act(button.dataset.action));
  }

  // ---- preview: twice a second while the tab is visible
  async function refreshPreview() {
    previewTimer = null;
    if (document.hidden) return;
    // Only a running broadcast has a picture (the preview is 503 otherwise).
    const state = $("broadcast-state").dataset.state;
    if (state !== "started" && state !== "paused") {
      $("preview").removeAttribute("src");
      if (previewURL) { URL.revokeObjectURL(previewURL); previewURL = null; }
      $("preview-note").textContent = "no preview: the broadcast is not running";
      previewTimer = setTimeout(refreshPreview, 500);
      return;
    }
    try {
      const response = await fetch("/v1/preview.jpg?width=640", { headers: headers(), cache: "no-store" });
      if (response.ok) {
        const url = URL.createObjectURL(await response.blob());
        $("preview").src = url;
        if (previewURL) URL.revokeObjectURL(previewURL);
        previewURL = url;
        $("preview-note").textContent = "";
      } else {
        $("preview-note").textContent = "no preview: " + response.status;
      }
    } catch (error) {
      $("preview-note").textContent = "no preview: " + error.message;
    }
    if (!document.hidden && !previewTimer) previewTimer = setTimeout(refreshPreview, 500);
  }
  function startPreview() {
    if (!previewTimer && !document.hidden) previewTimer = setTimeout(refreshPreview, 0);
  }
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) { clearTimeout(previewTimer); previewTimer = null; } else startPreview();
  });

  start();
})();
