// fk-agentd dashboard: table sorting and filtering, and live updates over SSE.
// Embedded in the binary; no framework, no build step.
"use strict";

function query(extra) {
  const run = document.body.dataset.run;
  const p = new URLSearchParams(extra);
  if (run) p.set("run", run);
  return p.toString();
}

// Sortable tables: click a heading; numbers sort by their data-v value.
function sortBy(table, col, dir) {
  const type = table.tHead.rows[0].cells[col].dataset.type;
  const rows = Array.from(table.tBodies[0].rows);
  const key = (r) => {
    const c = r.cells[col];
    return type === "num" ? parseFloat(c.dataset.v || "0") : c.textContent.trim().toLowerCase();
  };
  rows.sort((a, b) => (key(a) < key(b) ? -dir : key(a) > key(b) ? dir : 0));
  rows.forEach((r) => table.tBodies[0].appendChild(r));
  Array.from(table.tHead.rows[0].cells).forEach((th, i) => {
    th.classList.toggle("asc", i === col && dir > 0);
    th.classList.toggle("desc", i === col && dir < 0);
  });
  table.dataset.sortCol = col;
  table.dataset.sortDir = dir;
}

function initTables(root) {
  root.querySelectorAll("table.sortable").forEach((table) => {
    Array.from(table.tHead.rows[0].cells).forEach((th, col) => {
      th.addEventListener("click", () => {
        const same = table.dataset.sortCol === String(col);
        sortBy(table, col, same ? -Number(table.dataset.sortDir) : 1);
        sessionStorage.setItem("sort:" + table.id, col + ":" + table.dataset.sortDir);
      });
    });
    const saved = sessionStorage.getItem("sort:" + table.id);
    if (saved) {
      const [col, dir] = saved.split(":").map(Number);
      sortBy(table, col, dir);
    }
  });
  const quick = root.querySelector("#quick-filter");
  if (quick) {
    const apply = () => {
      const needle = quick.value.toLowerCase();
      document.querySelectorAll("#sessions tbody tr").forEach((r) => {
        r.hidden = needle && !r.cells[0].textContent.toLowerCase().includes(needle);
      });
    };
    quick.addEventListener("input", apply);
  }
}

// Pages other than a session refresh their <main> when the run's events move (at most
// every 2 s); the session page gets its readable view pushed.
function followRun() {
  const main = document.querySelector("main");
  if (!main || main.dataset.live === "/session" || document.body.dataset.status !== "running") return;
  let seq = document.body.dataset.seq;
  let pending = false;
  const es = new EventSource("/live/run?" + query({ after: seq }));
  es.addEventListener("seq", async (ev) => {
    const msg = JSON.parse(ev.data);
    if (String(msg.seq) === String(seq) && msg.status === "running") return;
    seq = msg.seq;
    if (msg.status !== "running") es.close();
    if (pending) return;
    pending = true;
    setTimeout(async () => {
      pending = false;
      const resp = await fetch(location.href, { credentials: "same-origin" });
      const doc = new DOMParser().parseFromString(await resp.text(), "text/html");
      const fresh = doc.querySelector("main");
      const quick = document.querySelector("#quick-filter");
      const needle = quick ? quick.value : "";
      if (fresh) main.innerHTML = fresh.innerHTML;
      const status = doc.querySelector("#run-status");
      if (status) document.querySelector("#run-status").replaceWith(status);
      document.body.dataset.seq = seq;
      initTables(main);
      const q2 = document.querySelector("#quick-filter");
      if (q2 && needle) { q2.value = needle; q2.dispatchEvent(new Event("input")); }
    }, msg.status === "running" ? 2000 : 0);
  });
}

function followSession() {
  const live = document.querySelector("#session-live");
  if (!live || live.dataset.done === "true") return;
  const es = new EventSource("/live/session?" + query({ target: live.dataset.target, after: live.dataset.after }));
  es.addEventListener("view", (ev) => {
    const msg = JSON.parse(ev.data);
    document.querySelector("#session-view").textContent = msg.text;
    document.querySelector("#session-state").textContent = msg.state;
    document.querySelector("#session-verdict").textContent = msg.verdict;
    document.querySelector("#session-end").textContent = msg.end;
    document.querySelector("#event-count").textContent = msg.events;
    live.dataset.after = msg.seq;
    live.dataset.updates = String(Number(live.dataset.updates || "0") + 1);
  });
  es.addEventListener("end", (ev) => {
    es.close();
    live.dataset.done = "true";
    document.querySelector("#live-note").textContent = ev.data === "stopped"
      ? "the dashboard stopped; reload when it is back to follow the session again"
      : "the session has ended";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  initTables(document);
  followRun();
  followSession();
});
