"use strict";
// What the runs table's rows and the event log hold: a run's row made or rewritten (only the
// cells that differ), and an event's line in the log. Writing them at the right time (once per
// frame), hiding rows and selecting one is dashboard.js's.
//
// fisk.makeRow(run) -> <tr>; fisk.fillRow(row, run); fisk.eventLog(schedule) -> { add(name,
// data), flush() }: `add` keeps the line and calls schedule(); `flush` writes the kept lines.
(function () {
  const { $, visible, setText, setData, age, total, statusClass, status } = fisk;

  // The cells of a row, in the table's column order.
  const CELLS = ["name", "id", "", "state", "num", "num", "num age", "", "owner"];

  const rowTitle = (run) => visible((run.name ? run.name + " \u00b7 " : "") + run.run_id);

  // A new row, written straight (nothing to compare with): the first listing makes 1,000.
  // (Its hiding, selection and age ticking are the table's: dashboard.js.)
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
  }

  fisk.makeRow = makeRow;
  fisk.fillRow = fillRow;
})();

fisk.eventLog = function (schedule) {
  const { $, visible } = fisk;
  // ---- The event log (the last 200 lines, appended once per frame).

  const pendingLog = [];

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

  return { add: logEvent, flush: flushLog };
};
