"use strict";
// Every string from the server is inserted with textContent (never innerHTML): a run's name,
// a prompt or a model's answer may hold markup.
(function () {
  const query = new URLSearchParams(location.search);
  const token = query.get("token");
  if (token !== null) {
    // Kept in memory only: out of the address bar and the history (a shared screen, a copied
    // link). A reload needs the ?token= link again (the page itself is behind the token).
    query.delete("token");
    const rest = query.toString();
    history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  }
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const runs = new Map();          // run_id -> Run, with .seenAt (ms) for the age column
  let selected = null;             // the run shown in the detail pane
  let shownState = null;           // its state when its diagram was last fetched
  let diagramUrl = null;
  let detailTimer = null;
  let detailSeq = 0;               // the last detail request: only its answer is shown
  const $ = (id) => document.getElementById(id);
  // Control and bidi characters would hide or reorder what the operator reads (U+202E turns
  // "exe.txt" around): they are shown as \uXXXX escapes. Tab and newline stay.
  const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
  const visible = (text) => String(text).replace(HIDDEN, (c) => "\\u" + c.charCodeAt(0).toString(16).padStart(4, "0"));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(visible(c)));
    return node;
  }

  function showError(message) {
    const box = $("error");
    box.textContent = visible(message);
    box.classList.toggle("shown", Boolean(message));
  }

  async function api(method, path, body) {
    const init = { method, headers: { ...headers } };
    if (method !== "GET") {  // the API takes only JSON on a POST, a body or not (415 else)
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body === undefined ? {} : body);
    }
    const response = await fetch(path, init);
    let value = null;
    try { value = await response.json(); } catch (e) { value = null; }
    if (!response.ok) {
      const why = value && typeof value.error === "string" ? value.error : response.statusText;
      throw new Error(method + " " + path + ": " + response.status + " " + why);
    }
    return value;
  }

  const runPath = (id, ...rest) => ["/api/runs", id, ...rest].map((p, i) => i ? encodeURIComponent(p) : p).join("/");

  function age(run) {
    const s = (run.age_seconds || 0) + (Date.now() - run.seenAt) / 1000;
    if (s >= 86400) return Math.floor(s / 86400) + "d";
    if (s >= 3600) return Math.floor(s / 3600) + "h";
    if (s >= 60) return Math.floor(s / 60) + "m";
    return Math.floor(s) + "s";
  }

  const total = (run) => (run.tokens && run.tokens.total != null ? run.tokens.total : 0);

  function status(run) {
    return el("span", { class: "status " + String(run.status).replace(/[^a-z_]/g, "") }, run.status);
  }

  function renderRuns() {
    const body = $("runs").tBodies[0];
    const ordered = [...runs.values()].sort((a, b) => String(b.created).localeCompare(String(a.created)));
    body.replaceChildren(...ordered.map((run) => {
      const row = el("tr", { "data-run": run.run_id, "data-status": run.status, "data-state": run.state },
        el("td", { class: "id" }, run.run_id),
        el("td", { class: "name" }, run.name || ""),
        el("td", {}, status(run)),
        el("td", {}, run.state),
        el("td", { class: "num" }, run.iteration),
        el("td", { class: "num" }, total(run)),
        el("td", { class: "num age" }, age(run)),
        el("td", {}, run.approval ? run.approval.tool : ""),
        el("td", { class: "owner" }, run.owner || ""));
      if (run.run_id === selected) row.classList.add("selected");
      row.addEventListener("click", () => select(run.run_id));
      return row;
    }));
    $("no-runs").hidden = runs.size > 0;
    const counts = {};
    for (const run of runs.values()) counts[run.status] = (counts[run.status] || 0) + 1;
    $("summary").textContent = visible(Object.entries(counts).map(([k, n]) => n + " " + k).join(", "));
    renderApprovals();
  }

  function approvalCard(approval) {
    const card = el("div", { class: "approval", "data-run": approval.run_id, "data-tool-use-id": approval.tool_use_id },
      el("div", { class: "what" }, "Run " + approval.run_id + " wants to call " + approval.tool),
      el("div", {}, "tag " + (approval.tag || "") + ", tool call " + approval.tool_use_id),
      el("pre", {}, JSON.stringify(approval.input, null, 2)));
    const buttons = el("div");
    for (const [answer, label, cls] of [["once", "Approve", "approve"], ["always", "Always", "approve"], ["deny", "Deny", "deny"]]) {
      const button = el("button", { type: "button", class: cls, "data-answer": answer }, label);
      button.addEventListener("click", async (event) => {
        event.stopPropagation();
        for (const b of buttons.querySelectorAll("button")) b.disabled = true;
        try {
          const since = eventSeq;
          answered(await api("POST", runPath(approval.run_id, "approvals", approval.tool_use_id), { answer }), since);
          showError("");
        } catch (e) {
          showError(e.message);
          for (const b of buttons.querySelectorAll("button")) b.disabled = false;
        }
      });
      buttons.append(button);
    }
    card.append(buttons);
    return card;
  }

  function renderApprovals() {
    const pending = [...runs.values()].filter((r) => r.approval);
    const box = $("approvals");
    box.replaceChildren(...(pending.length ? pending.map((r) => approvalCard(r.approval)) : [el("p", { class: "empty" }, "none")]));
    const mine = runs.get(selected);
    $("d-approval").replaceChildren(...(mine && mine.approval ? [approvalCard(mine.approval)] : []));
  }

  // The stream is the truth about a run: an answer to a request (an action, a GET) is shown
  // only if no event about that run came while the request was on its way, since the answer
  // may be older than the event.
  let eventSeq = 0;
  const lastEvent = new Map();     // run_id -> eventSeq of its last Run event
  const stale = (runId, since) => (lastEvent.get(runId) || 0) > since;
  function answered(run, since) {
    if (run && !stale(run.run_id, since)) upsert(run);
  }

  const ENDED_STATES = ["completed", "suspended", "failed", "budget_exhausted", "iterations_exhausted"];
  const settling = new Set();

  // A run's last state can be announced while its task is still winding down (status still
  // "running"): ask again, a little later each time, until the status says it stopped.
  async function settle(runId) {
    if (settling.has(runId)) return;
    settling.add(runId);
    try {
      for (let wait = 50; wait < 20000; wait *= 2) {
        await new Promise((done) => setTimeout(done, wait));
        const known = runs.get(runId);
        if (!known || !["queued", "running"].includes(known.status)) return;
        try {
          const since = eventSeq;
          const { transcript, path, ...run } = await api("GET", runPath(runId));
          if (stale(runId, since)) return;  // the stream has told more since
          if (!["queued", "running"].includes(run.status)) { upsert(run); return; }
        } catch (e) { return; }
      }
    } finally {
      settling.delete(runId);
    }
  }

  function upsert(run) {
    if (!run || typeof run.run_id !== "string") return;
    run.seenAt = Date.now();
    runs.set(run.run_id, run);
    renderRuns();
    if (run.run_id === selected) refreshDetail();
    if (ENDED_STATES.includes(run.state) && ["queued", "running"].includes(run.status)) settle(run.run_id);
  }

  async function loadRuns() {
    try {
      const since = eventSeq;
      const value = await api("GET", "/api/runs");
      const now = Date.now();
      const listed = new Set();
      for (const run of value.runs || []) {
        listed.add(run.run_id);
        if (stale(run.run_id, since)) continue;
        run.seenAt = now;
        runs.set(run.run_id, run);
      }
      for (const id of [...runs.keys()]) if (!listed.has(id) && !stale(id, since)) runs.delete(id);
      renderRuns();
      showError("");
    } catch (e) {
      showError(e.message);
    }
  }

  function select(runId) {
    selected = runId;
    shownState = null;
    history.replaceState(null, "", location.pathname + location.search + "#run=" + encodeURIComponent(runId));
    $("detail").hidden = false;
    renderRuns();
    refreshDetail(true);
  }

  function refreshDetail(now) {
    clearTimeout(detailTimer);
    detailTimer = setTimeout(showDetail, now ? 0 : 150);  // one fetch for a burst of events
  }

  async function showDetail() {
    const id = selected;
    if (!id) return;
    let run;
    const since = eventSeq;
    const mine = ++detailSeq;
    try {
      run = await api("GET", runPath(id));
    } catch (e) {
      showError(e.message);
      return;
    }
    if (id !== selected || mine !== detailSeq) return;  // a later request answers
    run.seenAt = Date.now();
    const { transcript, path, ...row } = run;
    if (!stale(id, since)) runs.set(id, row);
    renderRuns();
    $("d-id").textContent = id;
    $("d-name").textContent = visible(run.name || "");
    $("d-status").replaceChildren(status(run));
    $("d-state").textContent = visible(run.state);
    $("d-iteration").textContent = run.iteration;
    const t = run.tokens || {};
    $("d-tokens").textContent = total(run) + " (input " + (t.input || 0) + ", output " + (t.output || 0) +
      ", cache read " + (t.cache_read || 0) + ", cache write " + (t.cache_creation || 0) + ")";
    $("d-outcome").textContent = visible(run.outcome || "");
    $("d-answer").textContent = visible(run.answer || "");
    const steps = (path || []).map((s, i, all) => el("span", { class: i === all.length - 1 ? "current" : "" }, s));
    $("d-path").replaceChildren(...steps.flatMap((s, i) => (i ? [" \u2192 ", s] : [s])));
    $("transcript").replaceChildren(...(transcript || []).map((entry) => el("div", { class: "entry " + (entry.role === "assistant" ? "assistant" : "user") },
      el("div", { class: "head" }, entry.role + " " + entry.kind + (entry.name ? " " + entry.name : ""),
        ...(entry.is_error ? [el("span", { class: "error" }, " (error)")] : [])),
      el("pre", {}, entry.text || ""))));
    if (!(transcript || []).length) $("transcript").replaceChildren(el("p", { class: "empty" }, "no messages yet"));
    $("b-suspend").disabled = !["queued", "running", "parked"].includes(run.status);
    $("b-resume").disabled = run.status !== "suspended";
    $("b-abort").disabled = ["completed", "failed", "aborted", "budget_exhausted", "iterations_exhausted"].includes(run.status);
    const key = run.state + "/" + (path || []).length;
    if (key !== shownState) {
      shownState = key;
      await showDiagram(id, key);
    }
  }

  async function showDiagram(id, key) {
    const response = await fetch(runPath(id, "diagram.svg"), { headers });
    if (id !== selected) return;
    const img = $("diagram");
    if (!response.ok) {
      img.hidden = true;
      $("diagram-note").textContent = "no diagram (" + response.status + ")";
      return;
    }
    const url = URL.createObjectURL(await response.blob());
    if (diagramUrl) URL.revokeObjectURL(diagramUrl);
    diagramUrl = url;
    img.src = url;
    img.dataset.state = key;
    img.hidden = false;
    $("diagram-note").textContent = "";
  }

  for (const [id, action] of [["b-suspend", "suspend"], ["b-resume", "resume"], ["b-abort", "abort"]]) {
    $(id).addEventListener("click", async () => {
      try { const since = eventSeq; answered(await api("POST", runPath(selected, action)), since); showError(""); }
      catch (e) { showError(e.message); }
    });
  }

  function logEvent(name, data) {
    const log = $("events");
    const skip = new Set(["type", "run_id", "messages", "transcript", "path", "tokens", "approval", "answer", "created", "age_seconds"]);
    const fields = Object.entries(data).filter(([k, v]) => !skip.has(k) && v !== null && v !== "")
      .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v)).slice(0, 80));
    const line = new Date().toTimeString().slice(0, 8) + " " + (data.run_id || "") + " " + name + " " + fields.join(" ");
    log.append(document.createTextNode(visible(line).replace(/\s+/g, " ") + "\n"));
    while (log.childNodes.length > 200) log.firstChild.remove();
    log.scrollTop = log.scrollHeight;
  }

  const RUN_EVENTS = ["RunSubmitted", "RunParked", "RunUpdated"];
  const TYPED_EVENTS = ["RunStarted", "RunResumed", "StateEntered", "MessageReceived", "ToolCalled", "ToolFinished",
    "ApprovalAsked", "ApprovalGranted", "ApprovalDenied", "WarningRaised", "RunEnded"];

  function connect() {
    const source = new EventSource("/api/events" + (token ? "?token=" + encodeURIComponent(token) : ""));
    source.addEventListener("open", () => {
      $("live").textContent = "live";
      $("live").classList.add("on");
      loadRuns();  // whatever happened while not connected
      if (selected) refreshDetail(true);
    });
    source.addEventListener("error", () => {
      $("live").textContent = "reconnecting";
      $("live").classList.remove("on");
    });
    const handle = (name, run) => (event) => {
      let data;
      try { data = JSON.parse(event.data); } catch (e) { return; }
      if (!data || typeof data !== "object") return;
      logEvent(name, data);
      if (run && typeof data.run_id === "string") {
        lastEvent.set(data.run_id, ++eventSeq);
        upsert(data);
      }
      else if (data.run_id === selected) refreshDetail();
    };
    for (const name of RUN_EVENTS) source.addEventListener(name, handle(name, true));
    for (const name of TYPED_EVENTS) source.addEventListener(name, handle(name, false));
    source.addEventListener("message", handle("message", false));
    source.addEventListener("EventsDropped", () => {  // this page read too slowly: catch up
      loadRuns();
      if (selected) refreshDetail(true);
    });
  }

  setInterval(() => {
    for (const cell of document.querySelectorAll("#runs tbody tr")) {
      const run = runs.get(cell.dataset.run);
      if (run) cell.querySelector(".age").textContent = age(run);
    }
  }, 1000);

  const wanted = new URLSearchParams(location.hash.slice(1)).get("run");
  loadRuns().then(() => { if (wanted) select(wanted); });
  connect();
})();
