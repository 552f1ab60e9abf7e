"use strict";
// The dashboard's script is this file and the ones after it (fisk_sm/supervisor/page.py lists
// the order), put inline as one <script>. They share one name, `fisk`, made here: this file's
// DOM and fetch helpers; dashboard_stream.js's event stream; dashboard_detail.js's detail pane
// and approval cards; dashboard.js, last, the runs table and the wiring.
//
// Every string from the server is inserted with textContent (never innerHTML): a run's name,
// a prompt or a model's answer may hold markup.
const fisk = {};
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

  Object.assign(fisk, { headers, $, visible, el, setText, setData, showError, api, runPath, age, total, statusClass, status });
})();
