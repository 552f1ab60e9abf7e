"use strict";
// Every string from the server is inserted with textContent (never innerHTML): a run's name,
// a prompt or a model's answer may hold markup.
//
// Built for a thousand runs: each run has one <tr>, kept in `rows` (run_id -> row); an event
// about a run rewrites the cells of that row that changed, or inserts it, and nothing else.
// The writes of a burst of events wait for the next animation frame and are applied together
// (one layout per frame, however many events came). The first listing is built in a
// DocumentFragment and put in at once.
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

  // Writes only what differs: an unchanged cell is not touched (no mutation, no layout). A
  // cell keeps its one text node (even empty) and only its data changes.
  function setText(node, text) {
    const shown = visible(text);
    const only = node.firstChild;
    if (only !== null && only === node.lastChild && only.nodeType === Node.TEXT_NODE) {
      if (only.data !== shown) only.data = shown;
    } else if (node.textContent !== shown || !only) {
      node.replaceChildren(document.createTextNode(shown));
    }
  }
  function setData(node, key, value) {
    if (node.dataset[key] !== value) node.dataset[key] = value;
  }

  function showError(message) {
    const box = $("error");
    setText(box, message);
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
  const statusClass = (run) => "status " + String(run.status).replace(/[^a-z_]/g, "");

  function status(run) {
    return el("span", { class: statusClass(run) }, run.status);
  }

  // ---- The runs, their rows, the filter and the status tabs.

  const runs = new Map();          // run_id -> Run, with .seenAt (ms) for the age column
  const rows = new Map();          // run_id -> its <tr>
  const order = [];                // run ids as the rows stand: newest first
  const cards = new Map();         // run_id -> its card in #approvals
  const TABS = [["all", null], ["queued", ["queued"]], ["running", ["running"]], ["parked", ["parked"]],
    ["waiting", ["waiting"]], ["suspended", ["suspended"]], ["completed", ["completed"]], ["failed", ["failed"]],
    ["aborted", ["aborted"]], ["exhausted", ["budget_exhausted", "iterations_exhausted"]]];
  const TAB_OF = new Map(TABS.flatMap(([tab, statuses]) => (statuses || []).map((s) => [s, tab])));
  let tab = "all";
  let needle = "";                 // the filter, lower case
  const byStatus = new Map();      // status -> number of runs (the header's summary)
  const byTab = new Map();         // tab -> number of runs matching the filter text
  let selected = null;             // the run shown in the detail pane
  let selectedRow = null;

  const matchesText = (run) => !needle || ((run.name || "") + "\n" + run.run_id).toLowerCase().includes(needle);
  const shown = (run) => matchesText(run) && (tab === "all" || TAB_OF.get(run.status) === tab);

  function count(run, delta) {
    if (!run) return;
    byStatus.set(run.status, (byStatus.get(run.status) || 0) + delta);
    if (!matchesText(run)) return;
    byTab.set("all", (byTab.get("all") || 0) + delta);
    const t = TAB_OF.get(run.status);
    if (t) byTab.set(t, (byTab.get(t) || 0) + delta);
  }

  const tabButtons = new Map();
  for (const [name] of TABS) {
    const button = el("button", { type: "button", "data-tab": name }, el("span", { class: "label" }, name), el("span", { class: "count" }, "0"));
    button.addEventListener("click", () => { tab = name; refilter(); });
    tabButtons.set(name, button);
    $("tabs").append(button);
  }

  // The cells of a row, in the table's column order.
  const CELLS = ["name", "id", "", "state", "num", "num", "num age", "", "owner"];
  const ENDED_STATES = ["completed", "suspended", "failed", "budget_exhausted", "iterations_exhausted"];

  const rowTitle = (run) => visible((run.name ? run.name + " \u00b7 " : "") + run.run_id);

  // A new row, written straight (nothing to compare with): the first listing makes 1,000.
  function makeRow(run) {
    const row = document.createElement("tr");
    row.dataset.run = run.run_id;
    row.dataset.status = String(run.status);
    row.dataset.state = String(run.state);
    row.title = rowTitle(run);
    const texts = [run.name || "", run.run_id, null, run.state, run.iteration, total(run), age(run),
      run.approval ? run.approval.tool : "", run.owner || ""];
    for (let i = 0; i < CELLS.length; i++) {
      const cell = document.createElement("td");
      if (CELLS[i]) cell.className = CELLS[i];
      if (i === 2) cell.append(status(run));
      else if (texts[i] !== "") cell.append(document.createTextNode(visible(texts[i])));
      row.append(cell);
    }
    if (!shown(run)) row.hidden = true;
    if (run.run_id === selected) { row.classList.add("selected"); selectedRow = row; }
    if (ages) ages.observe(row);
    return row;
  }

  function fillRow(row, run) {
    const [name, , , state, iteration, tokens, when, approval, owner] = row.cells;
    const title = rowTitle(run);
    if (row.title !== title) row.title = title;
    setData(row, "status", String(run.status));
    setData(row, "state", String(run.state));
    setText(name, run.name || "");
    const badge = row.cells[2].firstChild;
    if (badge.className !== statusClass(run)) badge.className = statusClass(run);
    setText(badge, run.status);
    setText(state, run.state);
    setText(iteration, run.iteration);
    setText(tokens, total(run));
    setText(when, age(run));
    setText(approval, run.approval ? run.approval.tool : "");
    setText(owner, run.owner || "");
    const hide = !shown(run);
    if (row.hidden !== hide) row.hidden = hide;
  }

  // Where a run goes: newest first (by `created`); a run of the same second goes above.
  function position(created) {
    let lo = 0, hi = order.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (String(runs.get(order[mid]).created) > created) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  function insertRow(run) {
    const row = makeRow(run);
    const at = position(String(run.created));
    const next = order[at];
    order.splice(at, 0, run.run_id);
    rows.set(run.run_id, row);
    $("runs").tBodies[0].insertBefore(row, next === undefined ? null : rows.get(next));
  }

  function removeRun(id) {
    count(runs.get(id), -1);
    runs.delete(id);
    const row = rows.get(id);
    if (row) {
      if (ages) ages.unobserve(row);
      row.remove();
      rows.delete(id);
      order.splice(order.indexOf(id), 1);
    }
    showApproval(id, null);
  }

  // One run's new data: its row (and approval card) rewritten where it differs.
  function apply(run) {
    const id = run.run_id;
    const old = runs.get(id);
    run.seenAt = Date.now();
    count(old, -1);
    runs.set(id, run);
    count(run, 1);
    const row = rows.get(id);
    if (row) fillRow(row, run); else insertRow(run);
    showApproval(id, run.approval);
    if (id === selected) {
      showDetailApproval(run);
      refreshDetail();
    }
    if (ENDED_STATES.includes(run.state) && ["queued", "running"].includes(run.status)) settle(id);
  }

  // The counts, the summary and the notes: a few nodes, written once per frame.
  function updateCounts() {
    for (const [name, button] of tabButtons) {
      setText(button.lastChild, byTab.get(name) || 0);
      const active = name === tab;
      if (button.classList.contains("active") !== active) {
        button.classList.toggle("active", active);
        button.setAttribute("aria-pressed", String(active));
      }
    }
    setText($("summary"), [...byStatus].filter(([, n]) => n > 0).map(([k, n]) => n + " " + k).join(", "));
    const none = runs.size === 0;
    if ($("no-runs").hidden !== !none) $("no-runs").hidden = !none;
    const visibleCount = tab === "all" ? byTab.get("all") || 0 : byTab.get(tab) || 0;
    const noMatch = !none && visibleCount === 0;
    if ($("no-match").hidden !== !noMatch) $("no-match").hidden = !noMatch;
    const noCards = cards.size === 0;
    if ($("no-approvals").hidden !== !noCards) $("no-approvals").hidden = !noCards;
  }

  // Pending writes, applied at the next animation frame (a hidden tab gets no frames: a timer).
  const pending = new Map();       // run_id -> its latest Run not yet shown
  const pendingLog = [];
  let scheduled = false;
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    if (document.hidden) setTimeout(flush, 100); else requestAnimationFrame(flush);
  }
  function queue(run) {
    if (!run || typeof run.run_id !== "string") return;
    pending.set(run.run_id, run);
    schedule();
  }
  function flush() {
    scheduled = false;
    const batch = [...pending.values()];
    pending.clear();
    for (const run of batch) apply(run);
    updateCounts();
    flushLog();
  }

  function refilter() {
    byTab.clear();
    for (const run of runs.values()) {
      if (!matchesText(run)) continue;
      byTab.set("all", (byTab.get("all") || 0) + 1);
      const t = TAB_OF.get(run.status);
      if (t) byTab.set(t, (byTab.get(t) || 0) + 1);
    }
    for (const [id, row] of rows) {
      const hide = !shown(runs.get(id));
      if (row.hidden !== hide) row.hidden = hide;
    }
    updateCounts();
  }

  $("filter").addEventListener("input", () => {
    needle = $("filter").value.trim().toLowerCase();
    refilter();
  });

  $("runs").tBodies[0].addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-run]");
    if (row) select(row.dataset.run);
  });

  // The age column ticks for the rows in view only (a thousand rows off screen cost nothing).
  const inView = new Set();
  const ages = typeof IntersectionObserver === "function" ? new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (entry.isIntersecting) inView.add(entry.target); else inView.delete(entry.target);
    }
  }, { root: $("list") }) : null;
  setInterval(() => {
    for (const row of inView) {
      const run = runs.get(row.dataset.run);
      if (run) setText(row.cells[6], age(run));
    }
  }, 1000);

  // ---- Approvals.

  function approvalCard(approval) {
    const run = runs.get(approval.run_id);
    const who = run && run.name ? run.name : approval.run_id;
    const card = el("div", { class: "approval", "data-run": approval.run_id, "data-tool-use-id": approval.tool_use_id },
      el("div", { class: "what" }, who + " wants to call " + approval.tool),
      el("div", { class: "meta" }, "run " + approval.run_id + ", tag " + (approval.tag || "") + ", tool call " + approval.tool_use_id),
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

  // The card of run `id` in #approvals: kept while the same call waits, replaced or removed.
  function showApproval(id, approval) {
    const card = cards.get(id);
    if (card && approval && card.dataset.toolUseId === approval.tool_use_id) return;
    if (card) { card.remove(); cards.delete(id); }
    if (approval) {
      const fresh = approvalCard(approval);
      cards.set(id, fresh);
      $("approvals").append(fresh);
    }
  }

  function showDetailApproval(run) {
    const box = $("d-approval");
    const card = box.firstElementChild;
    const wanted = run && run.approval ? run.approval.tool_use_id : null;
    if ((card ? card.dataset.toolUseId : null) === wanted) return;
    box.replaceChildren(...(wanted ? [approvalCard(run.approval)] : []));
  }

  // The stream is the truth about a run: an answer to a request (an action, a GET) is shown
  // only if no event about that run came while the request was on its way, since the answer
  // may be older than the event.
  let eventSeq = 0;
  const lastEvent = new Map();     // run_id -> eventSeq of its last Run event
  const stale = (runId, since) => (lastEvent.get(runId) || 0) > since;
  function answered(run, since) {
    if (run && !stale(run.run_id, since)) queue(run);
  }

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
          if (!["queued", "running"].includes(run.status)) { queue(run); return; }
        } catch (e) { return; }
      }
    } finally {
      settling.delete(runId);
    }
  }

  // The whole listing: new rows built in a fragment (all of them, the first time), known
  // rows rewritten where they differ, rows of runs no longer listed removed.
  async function listOnce() {
    const since = eventSeq;
    const value = await api("GET", "/api/runs");
    const now = Date.now();
    const listed = new Set();
    const fresh = [];
    for (const run of value.runs || []) {
      if (!run || typeof run.run_id !== "string") continue;
      listed.add(run.run_id);
      if (stale(run.run_id, since)) continue;
      pending.delete(run.run_id);  // queued before this listing was asked for: older
      if (rows.has(run.run_id)) { apply(run); continue; }
      run.seenAt = now;
      count(runs.get(run.run_id), -1);
      runs.set(run.run_id, run);
      count(run, 1);
      fresh.push(run);
    }
    for (const id of [...runs.keys()]) if (!listed.has(id) && !stale(id, since)) removeRun(id);
    if (order.length === 0) {
      fresh.sort((a, b) => String(b.created).localeCompare(String(a.created)));
      const fragment = document.createDocumentFragment();
      for (const run of fresh) {
        const row = makeRow(run);
        rows.set(run.run_id, row);
        order.push(run.run_id);
        fragment.append(row);
      }
      $("runs").tBodies[0].append(fragment);
      for (const run of fresh) showApproval(run.run_id, run.approval);
    } else {
      for (const run of fresh) {
        insertRow(run);
        showApproval(run.run_id, run.approval);
      }
    }
    updateCounts();
    if (selected && runs.has(selected)) showDetailApproval(runs.get(selected));
    if (!listedOnce) {
      listedOnce = true;
      // #run=ID in the address: that run's detail, its row scrolled into the list's view
      const wanted = new URLSearchParams(location.hash.slice(1)).get("run");
      if (wanted && !selected) {
        select(wanted);
        if (selectedRow) selectedRow.scrollIntoView({ block: "nearest" });
      }
    }
  }

  // One listing at a time; a request while one is on its way asks once more after it.
  let listedOnce = false;
  let listing = null;
  let again = false;
  function loadRuns() {
    if (listing) { again = true; return listing; }
    listing = (async () => {
      try {
        do {
          again = false;
          try { await listOnce(); showError(""); } catch (e) { showError(e.message); }
        } while (again);
      } finally {
        listing = null;
      }
    })();
    return listing;
  }

  function select(runId) {
    selected = runId;
    shownState = null;
    history.replaceState(null, "", location.pathname + location.search + "#run=" + encodeURIComponent(runId));
    $("detail").hidden = false;
    if (selectedRow) selectedRow.classList.remove("selected");
    selectedRow = rows.get(runId) || null;
    if (selectedRow) selectedRow.classList.add("selected");
    showDetailApproval(runs.get(runId));
    refreshDetail(true);
  }

  // ---- The detail pane.

  let shownState = null;           // the selected run's state when its diagram was last fetched
  let diagramUrl = null;
  let detailTimer = null;
  let detailSeq = 0;               // the last detail request: only its answer is shown

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
    const { transcript, path, ...row } = run;
    if (!stale(id, since)) queue(row);
    setText($("d-title"), run.name || "");
    setText($("d-id"), id);
    setText($("d-name"), run.name || "");
    $("d-status").replaceChildren(status(run));
    setText($("d-state"), run.state);
    setText($("d-iteration"), run.iteration);
    const t = run.tokens || {};
    setText($("d-tokens"), total(run) + " (input " + (t.input || 0) + ", output " + (t.output || 0) +
      ", cache read " + (t.cache_read || 0) + ", cache write " + (t.cache_creation || 0) + ")");
    setText($("d-outcome"), run.outcome || "");
    setText($("d-answer"), run.answer || "");
    showDetailApproval(run);
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

  // ---- The event log (the last 200 lines, appended once per frame).

  function logEvent(name, data) {
    const skip = new Set(["type", "run_id", "messages", "transcript", "path", "tokens", "approval", "answer", "created", "age_seconds"]);
    const fields = Object.entries(data).filter(([k, v]) => !skip.has(k) && v !== null && v !== "")
      .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v)).slice(0, 80));
    const line = new Date().toTimeString().slice(0, 8) + " " + (data.run_id || "") + " " + name + " " + fields.join(" ");
    pendingLog.push(visible(line).replace(/\s+/g, " ") + "\n");
    if (pendingLog.length > 200) pendingLog.shift();
    schedule();
  }

  function flushLog() {
    if (!pendingLog.length) return;
    const log = $("events");
    log.append(...pendingLog.map((line) => document.createTextNode(line)));
    pendingLog.length = 0;
    while (log.childNodes.length > 200) log.firstChild.remove();
    log.scrollTop = log.scrollHeight;
  }

  // ---- The event stream: read with fetch (so the token goes in a header, not the URL), and
  // resumed after a dropped connection from the last event id seen (`Last-Event-ID`): the
  // server replays what came in between. Without an id to resume from, or after an
  // EventsGap (the server no longer holds what was missed, or restarted) or an EventsDropped
  // (this page read too slowly), the listing is loaded again.

  const RUN_EVENTS = new Set(["RunSubmitted", "RunParked", "RunUpdated"]);
  const RELOAD_EVENTS = new Set(["EventsGap", "EventsDropped"]);
  let lastId = null;               // the id of the last event read

  function live(on) {
    setText($("live"), on ? "live" : "reconnecting");
    $("live").classList.toggle("on", on);
  }

  function reload() {
    loadRuns();
    if (selected) refreshDetail(true);
  }

  function onEvent(name, text) {
    let data;
    try { data = JSON.parse(text); } catch (e) { return; }
    if (!data || typeof data !== "object") return;
    logEvent(name, data);
    if (RELOAD_EVENTS.has(name)) reload();
    else if (RUN_EVENTS.has(name) && typeof data.run_id === "string") {
      lastEvent.set(data.run_id, ++eventSeq);
      queue(data);
    }
    else if (data.run_id === selected) refreshDetail();
  }

  // The text/event-stream format: `field: value` lines, an event ended by an empty line.
  async function readEvents(body) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", name = "", data = [], id = lastId;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      const held = buffer.endsWith("\r") ? 1 : 0;  // maybe the first half of a \r\n
      const lines = buffer.slice(0, buffer.length - held).split(/\r\n|\r|\n/);
      buffer = lines.pop() + (held ? "\r" : "");
      for (const line of lines) {
        if (line === "") {
          lastId = id;
          if (data.length) onEvent(name || "message", data.join("\n"));
          name = "";
          data = [];
          continue;
        }
        if (line[0] === ":") continue;  // a comment (the server's keep-alive ping)
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text[0] === " ") text = text.slice(1);
        if (field === "event") name = text;
        else if (field === "data") data.push(text);
        else if (field === "id" && !text.includes("\u0000")) id = text;
      }
    }
  }

  async function connect() {
    let wait = 250;
    for (;;) {
      const init = { headers: { ...headers, Accept: "text/event-stream" }, cache: "no-store" };
      if (lastId) init.headers["Last-Event-ID"] = lastId;
      try {
        const response = await fetch("/api/events", init);
        if (!response.ok || !response.body) {
          if (response.status === 400) lastId = null;  // an id the server refuses: start afresh
          throw new Error("GET /api/events: " + response.status);
        }
        live(true);
        wait = 250;
        if (!lastId) reload();  // nothing to resume from: whatever happened while not connected
        await readEvents(response.body);
      } catch (e) {
        // a dropped connection, a server away: try again, a little later each time
      }
      if (!listedOnce) loadRuns();  // the stream would not open: show the runs anyway
      live(false);
      await new Promise((done) => setTimeout(done, wait));
      wait = Math.min(wait * 2, 5000);
    }
  }

  // The first listing is asked for once the stream is open (so that no event falls between
  // the two), or at once if it cannot open.
  updateCounts();
  connect();
})();
