"use strict";
// The event stream: read with fetch (so the token goes in a header, not the URL), and
// resumed after a dropped connection from the last event id seen (`Last-Event-ID`): the
// server replays what came in between. Without an id to resume from, or after an
// EventsGap (the server no longer holds what was missed, or restarted) or an EventsDropped
// (this page read too slowly), the page reloads its listing (`on.reload`).
//
// fisk.stream(on) -> { connect }, with the callbacks:
//   on.log(name, data)    every event (an object), before anything else is done with it
//   on.event(name, data)  every event but EventsGap and EventsDropped
//   on.reload()           load the listing again (nothing to resume from, or events lost)
//   on.live(open)         the stream opened (true) or is being connected again (false)
//   on.closed()           the stream closed or would not open (before the wait to retry)
fisk.stream = function (on) {
  const headers = fisk.headers;
  const RELOAD_EVENTS = new Set(["EventsGap", "EventsDropped"]);
  let lastId = null;               // the id of the last event read

  function onEvent(name, text) {
    let data;
    try { data = JSON.parse(text); } catch (e) { return; }
    if (!data || typeof data !== "object") return;
    on.log(name, data);
    if (RELOAD_EVENTS.has(name)) on.reload(); else on.event(name, data);
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
        on.live(true);
        wait = 250;
        if (!lastId) on.reload();  // nothing to resume from: whatever happened while not connected
        await readEvents(response.body);
      } catch (e) {
        // a dropped connection, a server away: try again, a little later each time
      }
      on.closed();
      on.live(false);
      await new Promise((done) => setTimeout(done, wait));
      wait = Math.min(wait * 2, 5000);
    }
  }

  return { connect };
};
