"use strict";
// The runs table, its status tabs and filter, the event log, and the wiring of the page (the
// helpers are dashboard_dom.js's, the stream dashboard_stream.js's, the detail pane
// dashboard_detail.js's, a row's cells and the log's lines dashboard_view.js's; page.py puts
// this file last).
//
// Built for a thousand runs: each run has one <tr>, kept in `rows` (run_id -> row); an event
// about a run rewrites the cells of that row that changed, or inserts it, and nothing else.
// The writes of a burst of events wait for the next animation frame and are applied together
// (one layout per frame, however many events came). The first listing is built in a
// DocumentFragment and put in at once.
(function () {
  const { $, el, setText, showError, api, runPath, age } = fisk;

  // ---- The runs, their rows, the filter and the status tabs.

  const runs = new Map();          // run_id -> Run, with .seenAt (ms) for the age column
  const rows = new Map();          // run_id -> its <tr>
  const order = [];                // run ids as the rows stand: newest first
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

  const ENDED_STATES = ["completed", "suspended", "failed", "budget_exhausted", "iterations_exhausted"];

  function makeRow(run) {
    const row = fisk.makeRow(run);
    if (!shown(run)) row.hidden = true;
    if (run.run_id === selected) { row.classList.add("selected"); selectedRow = row; }
    if (ages) ages.observe(row);
    return row;
  }

  function fillRow(row, run) {
    fisk.fillRow(row, run);
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
    const noCards = detail.cardCount() === 0;
    if ($("no-approvals").hidden !== !noCards) $("no-approvals").hidden = !noCards;
  }

  // Pending writes, applied at the next animation frame (a hidden tab gets no frames: a timer).
  const pending = new Map();       // run_id -> its latest Run not yet shown
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

  // The stream is the truth about a run: an answer to a request (an action, a GET) is shown
  // only if no event about that run came while the request was on its way, since the answer
  // may be older than the event.
  let eventSeq = 0;
  const lastEvent = new Map();     // run_id -> eventSeq of its last Run event
  const stale = (runId, since) => (lastEvent.get(runId) || 0) > since;
  function answered(run, since) {
    if (run && !stale(run.run_id, since)) queue(run);
  }

  const detail = fisk.detail({ runs, selected: () => selected, since: () => eventSeq, stale, queue, answered });
  const { showApproval, showDetailApproval } = detail;
  const refreshDetail = detail.refresh;

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
    detail.forget();
    history.replaceState(null, "", location.pathname + location.search + "#run=" + encodeURIComponent(runId));
    $("detail").hidden = false;
    if (selectedRow) selectedRow.classList.remove("selected");
    selectedRow = rows.get(runId) || null;
    if (selectedRow) selectedRow.classList.add("selected");
    showDetailApproval(runs.get(runId));
    refreshDetail(true);
  }

  // ---- The event log (the last 200 lines, appended once per frame: dashboard_view.js).

  const eventLog = fisk.eventLog(schedule);
  const logEvent = eventLog.add;
  const flushLog = eventLog.flush;

  // ---- The event stream (dashboard_stream.js) and what its events do here.

  const RUN_EVENTS = new Set(["RunSubmitted", "RunParked", "RunUpdated"]);

  function live(on) {
    setText($("live"), on ? "live" : "reconnecting");
    $("live").classList.toggle("on", on);
  }

  function reload() {
    loadRuns();
    if (selected) refreshDetail(true);
  }

  function onEvent(name, data) {
    if (RUN_EVENTS.has(name) && typeof data.run_id === "string") {
      lastEvent.set(data.run_id, ++eventSeq);
      queue(data);
    }
    else if (data.run_id === selected) refreshDetail();
  }

  const stream = fisk.stream({
    log: logEvent,
    event: onEvent,
    reload,
    live,
    closed() { if (!listedOnce) loadRuns(); },  // the stream would not open: show the runs anyway
  });

  // The first listing is asked for once the stream is open (so that no event falls between
  // the two), or at once if it cannot open.
  updateCounts();
  stream.connect();
})();
