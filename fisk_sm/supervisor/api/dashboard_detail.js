"use strict";
// The detail pane (the selected run: its fields, path, transcript, diagram and controls) and
// the approval cards (in #approvals, and the selected run's in the pane).
//
// fisk.detail(page) -> { refresh(now), forget(), showApproval(id, approval),
// showDetailApproval(run), cardCount() }, where `page` is the runs table's side:
//   page.runs             run_id -> Run (the Map itself, read only here)
//   page.selected()       the selected run's id, or null
//   page.since()          the stream's event counter now (see `stale` in dashboard.js)
//   page.stale(id, since) an event about run `id` came after `since`
//   page.queue(run)       show this Run in its row at the next frame
//   page.answered(run, since)  queue(run) unless stale
fisk.detail = function (page) {
  const { headers, $, el, setText, showError, api, runPath, total, status } = fisk;
  const runs = page.runs;
  const cards = new Map();         // run_id -> its card in #approvals

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
          const since = page.since();
          page.answered(await api("POST", runPath(approval.run_id, "approvals", approval.tool_use_id), { answer }), since);
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
    const id = page.selected();
    if (!id) return;
    let run;
    const since = page.since();
    const mine = ++detailSeq;
    try {
      run = await api("GET", runPath(id));
    } catch (e) {
      showError(e.message);
      return;
    }
    if (id !== page.selected() || mine !== detailSeq) return;  // a later request answers
    const { transcript, path, ...row } = run;
    if (!page.stale(id, since)) page.queue(row);
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
    if (id !== page.selected()) return;
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
      try { const since = page.since(); page.answered(await api("POST", runPath(page.selected(), action)), since); showError(""); }
      catch (e) { showError(e.message); }
    });
  }

  return { refresh: refreshDetail, forget() { shownState = null; }, showApproval, showDetailApproval, cardCount: () => cards.size };
};
