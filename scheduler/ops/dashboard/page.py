"""The dashboard's one page: plain HTML, CSS and JavaScript with no build step, served at `/`.

It follows the app's server-sent event streams (the runs list, or one run) and POSTs the buttons with
the action header (auth.ACTION_HEADER), which a page of another site cannot send without CORS.
"""

HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>chordflow runs</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { display: flex; gap: 1em; align-items: baseline; padding: .6em 1.2em; background: #1d2330; color: #fff; }
  header a { color: #fff; text-decoration: none; font-weight: 600; }
  #live { font-size: 12px; color: #9aa4b8; }
  main { padding: 1em 1.2em; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid #e3e6eb; vertical-align: top; }
  th { font-weight: 600; font-size: 12px; color: #5b6577; }
  tr.link { cursor: pointer; } tr.link:hover { background: #eef3fb; }
  .status { font-weight: 600; } .succeeded { color: #1a7f37; } .failed { color: #c62828; }
  .cancelled { color: #8a6d00; } .running, .queued { color: #1f5fbf; }
  .bar { display: inline-block; width: 140px; height: 8px; background: #e3e6eb; border-radius: 4px;
         vertical-align: middle; margin-right: .5em; overflow: hidden; }
  .bar > div { height: 100%; float: left; } .bar > .ok { background: #1f5fbf; } .bar > .bad { background: #c62828; }
  #failed td:first-child { width: 6em; }
  .error { color: #c62828; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
  .actions { margin: .8em 0; display: flex; gap: .5em; align-items: center; }
  button { padding: .3em .9em; } #message { color: #5b6577; }
  h2 { margin: .2em 0; font-size: 18px; } h3 { margin: 1.2em 0 .4em; font-size: 15px; }
  .meta { color: #5b6577; }
</style>
</head>
<body>
<header><a href="#/">chordflow runs</a><span id="live">connecting…</span></header>
<main id="runs-view">
  <table id="runs">
    <thead><tr><th>run</th><th>workflow</th><th>priority</th><th>status</th><th>progress</th><th>rate</th><th>ETA</th>
      <th>started</th><th>duration</th><th>llm</th></tr></thead>
    <tbody></tbody>
  </table>
</main>
<main id="run-view" hidden>
  <h2>run <span id="run-id"></span> <span id="run-status" class="status"></span></h2>
  <div class="meta" id="run-meta"></div>
  <div class="meta" id="run-llm"></div>
  <div class="error" id="run-error"></div>
  <div class="actions">
    <button id="cancel">Cancel</button><button id="resume">Resume</button><button id="redrive">Redrive</button>
    <span id="message"></span>
  </div>
  <h3>nodes</h3>
  <table id="nodes"><thead><tr><th>node</th><th>type</th><th>state</th><th>items</th><th>failed</th></tr></thead>
    <tbody></tbody></table>
  <h3>failed items</h3>
  <div class="actions">
    <label>node <select id="failed-node"></select></label>
    <button id="failed-prev">&lsaquo; previous</button><span id="failed-range"></span>
    <button id="failed-next">next &rsaquo;</button>
  </div>
  <div class="meta" id="failed-note"></div>
  <table id="failed"><thead><tr><th>index</th><th>error</th></tr></thead><tbody></tbody></table>
</main>
<script>
"use strict";
// Same-origin URLs built from location.origin: a page opened as http://user:pw@host/ must not put the
// credentials in its requests (fetch refuses such URLs); the browser sends them from its auth cache.
const url = (path) => new URL(path, location.origin).href;
const $ = (id) => document.getElementById(id);
const PAGE = 50;
let source = null, current = null, failed = {node: null, skip: 0, key: null};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v); else node[k] = v;
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}
function seconds(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}
function bar(done, total, failedCount) {  // succeeded items blue, failed ones red
  const pct = (n) => (total ? Math.min(100, (100 * n) / total) : 0);
  return el("span", {class: "bar"}, el("div", {class: "ok", style: `width:${pct(done - failedCount)}%`}),
            el("div", {class: "bad", style: `width:${pct(failedCount)}%`}));
}
function progressCell(r) {
  if (r.waiting) return el("td", {class: "progress"}, r.waiting);
  if (!r.total && !r.done) return el("td", {class: "progress"}, r.steps + " steps");
  const total = r.total === null ? r.read + "+" : r.total;
  const cell = el("td", {class: "progress", "data-done": r.done, "data-total": r.total ?? ""});
  cell.append(bar(r.done, r.total || r.read, r.failed), `${r.done}/${total}`);
  if (r.failed) cell.append(el("span", {class: "failed"}, ` (${r.failed} failed)`));
  return cell;
}
function llmText(u) {  // a run's model calls: what `chordflow status` prints on its llm line
  if (!u) return "-";
  const cost = u.cost_usd === undefined ? "" : `, $${u.cost_usd.toFixed(6)}`;
  return `${u.calls} calls (${u.cached_calls} cached), ${u.input_tokens} input tokens, `
    + `${u.output_tokens} output tokens${cost}`;
}
function withUsage(node, u) {  // the numbers as data-calls, data-input-tokens, ... too
  for (const k of ["calls", "cached_calls", "input_tokens", "output_tokens", "cost_usd"]) {
    if (u && u[k] !== undefined) node.setAttribute("data-" + k.replaceAll("_", "-"), u[k]);
    else node.removeAttribute("data-" + k.replaceAll("_", "-"));
  }
  return node;
}
function listen(path, onData) {
  if (source) source.close();
  source = new EventSource(url(path));
  source.onopen = () => { $("live").textContent = "live"; };
  source.onerror = () => { $("live").textContent = "reconnecting…"; };
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    const at = new Date(data.at * 1000).toLocaleTimeString();
    $("live").textContent = data.error ? "error: " + data.error : "live · " + at;
    if (!data.error) onData(data);
  };
}

function showRuns() {
  current = null;
  $("runs-view").hidden = false; $("run-view").hidden = true;
  listen("api/runs/events", (data) => {
    const body = $("runs").tBodies[0];
    body.replaceChildren(...data.runs.map((r) => {
      const row = el("tr", {class: "link", "data-run": r.run_id},
        el("td", {}, el("a", {href: "#/run/" + encodeURIComponent(r.run_id)}, r.run_id)),
        el("td", {}, r.workflow), el("td", {class: "priority"}, r.priority),
        el("td", {class: "status " + r.status}, r.status), progressCell(r),
        el("td", {}, r.rate ? r.rate.toFixed(1) + "/s" : "-"), el("td", {}, seconds(r.eta_s)),
        el("td", {}, new Date(r.created * 1000).toLocaleString()), el("td", {}, seconds(r.duration)),
        withUsage(el("td", {class: "llm"}, llmText(r.llm)), r.llm));
      row.onclick = () => { location.hash = "#/run/" + encodeURIComponent(r.run_id); };
      return row;
    }));
  });
}

function showRun(runId) {
  current = runId; failed = {node: null, skip: 0, key: null};
  $("runs-view").hidden = true; $("run-view").hidden = false;
  $("run-id").textContent = runId; $("message").textContent = "";
  $("nodes").tBodies[0].replaceChildren(); $("failed").tBodies[0].replaceChildren(); $("failed-node").replaceChildren();
  listen("api/runs/" + encodeURIComponent(runId) + "/events", (data) => renderRun(data));
}

function renderRun(data) {
  const r = data.run;
  if (r.run_id !== current) return;
  $("run-status").textContent = r.status + (r.waiting ? ": " + r.waiting : "");
  $("run-status").className = "status " + r.status;
  const total = r.total === null ? r.read + "+" : r.total;
  $("run-meta").textContent = `${r.workflow} · ${r.backend} · ${r.priority} priority · `
    + `${r.done}/${total} items · ${r.failed} failed · `
    + `${r.rate ? r.rate.toFixed(1) + "/s" : "-"} · ETA ${seconds(r.eta_s)} · started `
    + `${new Date(r.created * 1000).toLocaleString()} · ${seconds(r.duration)}`;
  withUsage($("run-llm"), r.llm).textContent = r.llm ? "llm: " + llmText(r.llm) : "";
  $("run-error").textContent = r.error || "";
  const final = ["succeeded", "failed", "cancelled"].includes(r.status);
  $("cancel").disabled = final || r.backend !== "celery";
  $("resume").disabled = !(r.status === "failed" || r.status === "cancelled") || r.dataset;
  $("redrive").disabled = !(final && r.dataset && (r.failed > 0 || r.done < r.total));
  const nodes = r.dataset ? [{id: "records", type: "dataset job", batch: true, state: r.status,
                              progress: {total: r.total, done: r.done, failed: r.failed}}] : data.nodes;
  $("nodes").tBodies[0].replaceChildren(...nodes.map((n) => {
    const p = n.progress;
    const items = p ? el("td", {class: "progress", "data-done": p.done, "data-total": p.total ?? ""},
                         bar(p.done, p.total, p.failed), `${p.done}/${p.total ?? "?"}`)
                    : el("td", {class: "progress"}, n.batch ? "-" : "");
    return el("tr", {"data-node": n.id}, el("td", {}, n.id), el("td", {}, n.type),
              el("td", {class: "status " + n.state}, n.state), items,
              el("td", {class: p && p.failed ? "failed" : ""}, p ? p.failed : ""));
  }));
  const choices = nodes.filter((n) => n.batch).map((n) => n.id);
  const select = $("failed-node");
  if ([...select.options].map((o) => o.value).join() !== choices.join()) {
    select.replaceChildren(...choices.map((id) => el("option", {value: id}, id)));
    const withFailures = nodes.find((n) => n.progress && n.progress.failed);
    if (withFailures) select.value = withFailures.id;
  }
  const chosen = nodes.find((n) => n.id === select.value);
  const counts = chosen && chosen.progress ? chosen.progress.failed + "/" + chosen.progress.done : "";
  const key = select.value + ":" + counts + ":" + r.status;
  if (key !== failed.key) { failed.key = key; loadFailed(); }  // refresh when the node's counts change
}

async function loadFailed() {
  const node = $("failed-node").value, runId = current;
  if (!runId) return;
  if (node !== failed.node) { failed.node = node; failed.skip = 0; }
  const query = `?node=${encodeURIComponent(node)}&skip=${failed.skip}&limit=${PAGE}`;
  const response = await fetch(url("api/runs/" + encodeURIComponent(runId) + "/failed" + query));
  const page = await response.json();
  if (runId !== current) return;
  $("failed-note").textContent = page.error || page.note || (page.items.length ? "" : "no failed items");
  $("failed").tBodies[0].replaceChildren(...(page.items || []).map((item) =>
    el("tr", {"data-index": item.index}, el("td", {}, item.index), el("td", {class: "error"}, item.error))));
  $("failed-range").textContent = page.items && page.items.length
    ? ` ${failed.skip + 1} to ${failed.skip + page.items.length} ` : " ";
  $("failed-prev").disabled = failed.skip === 0;
  $("failed-next").disabled = !page.more;
}

async function act(action) {
  if (action === "cancel" && !confirm(`Cancel run ${current}?`)) return;
  $("message").textContent = action + "…";
  const response = await fetch(url(`api/runs/${encodeURIComponent(current)}/${action}`),
                               {method: "POST", headers: {"X-Chordflow-Action": "1"}});
  const body = await response.json();
  $("message").textContent = body.message || ("error: " + body.error);
}

$("cancel").onclick = () => act("cancel");
$("resume").onclick = () => act("resume");
$("redrive").onclick = () => act("redrive");
$("failed-node").onchange = () => loadFailed();
$("failed-prev").onclick = () => { failed.skip = Math.max(0, failed.skip - PAGE); loadFailed(); };
$("failed-next").onclick = () => { failed.skip += PAGE; loadFailed(); };
function route() {
  const match = location.hash.match(/^#\\/run\\/(.+)$/);
  if (match) showRun(decodeURIComponent(match[1])); else showRuns();
}
window.addEventListener("hashchange", route);
route();
</script>
</body>
</html>
"""
