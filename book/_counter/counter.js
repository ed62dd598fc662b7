// The counter page (counter.md): the form, the worker that runs `attnid count` in Pyodide (worker.js),
// and what it answers drawn as the command prints it. At load the page reads only _counter/manifest.json (the
// versions, presets and released files to pick from); Python is loaded at the first Count.
const BASE = new URL("./", import.meta.url); // _counter/, beside the pages
const $ = (id) => document.getElementById(id);
const NUM = new Intl.NumberFormat("en-US");
const state = { manifest: null, preset: null, name: "config.json", worker: null, waiting: new Map(), next: 1 };

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

function status(text) {
  $("counter-status").textContent = text;
}

function show(...nodes) {
  $("counter-result").replaceChildren(...nodes);
}

async function loadManifest() {
  const r = await fetch(new URL("manifest.json", BASE));
  if (!r.ok) throw new Error(`the counter's files are missing from this site (${r.status})`);
  const m = await r.json();
  for (const [cls, v] of [["attnid", m.attnid], ["transformers", m.transformers], ["pyodide", m.pyodide]]) {
    for (const e of document.querySelectorAll(`.counter-${cls}`)) e.textContent = v;
  }
  const groups = {
    released: el("optgroup", { label: "Released config.json files, as published" }),
    families: el("optgroup", { label: "Released files of 2025–2026 families, field by field (chapter 9)" }),
    book: el("optgroup", { label: "The book's configs (a preset's architecture fields)" }),
  };
  for (const c of m.configs) groups[c.group].append(el("option", { value: `config:${c.file}` }, c.name));
  const presets = el("optgroup", { label: "Presets (attnid count --preset)" });
  for (const p of m.presets) presets.append(el("option", { value: `preset:${p.name}` }, `${p.name}: ${p.description}`));
  $("counter-pick").append(groups.released, groups.families, groups.book, presets);
  state.manifest = m;
}

async function pick(value) {
  state.preset = null;
  if (value.startsWith("preset:")) {
    state.preset = value.slice(7);
    $("counter-text").value = "";
    $("counter-text").placeholder = `The preset ${state.preset}: press Count (or paste a file to count instead)`;
  } else if (value.startsWith("config:")) {
    const file = value.slice(7);
    const r = await fetch(new URL(file, BASE));
    $("counter-text").value = r.ok ? await r.text() : "";
    state.name = file.split("/").pop();
  } else {
    state.name = "config.json";
  }
}

async function takeFile(file) {
  if (!file) return;
  $("counter-text").value = await file.text();
  state.name = file.name;
  state.preset = null;
  $("counter-pick").value = "";
}

// The box edited: a preset gives way to the text; a box emptied, or replaced whole by a paste, holds a file of the
// reader's own (counted as config.json), no longer the one picked or dropped.
function ownText() {
  if (state.preset !== null || !$("counter-text").value) {
    $("counter-pick").value = "";
    state.name = "config.json";
  }
  state.preset = null;
}

function replacedWhole(e) {
  const box = e.target;
  if (e.inputType === "insertFromPaste" && box.selectionStart === 0 && box.selectionEnd === box.value.length) {
    $("counter-pick").value = "";
    state.name = "config.json";
  }
}

function ask(message) {
  if (state.worker === null) {
    state.worker = new Worker(new URL("worker.js", import.meta.url), { type: "module" });
    state.worker.onmessage = ({ data }) => {
      state.waiting.get(data.id)?.(data);
      state.waiting.delete(data.id);
    };
    // a worker that cannot start (its module or Pyodide missing from the site) answers every Count waiting on it
    state.worker.onerror = (e) => {
      for (const [id, resolve] of state.waiting) resolve({ id, failure: e.message || "Python could not start" });
      state.waiting.clear();
      state.worker = null; // the next Count starts a new one
    };
  }
  const id = state.next++;
  return new Promise((resolve) => {
    state.waiting.set(id, resolve);
    state.worker.postMessage({ ...message, id, package: state.manifest.package });
  });
}

async function count() {
  const button = $("counter-run");
  const scope = document.querySelector('input[name="counter-scope"]:checked').value;
  const text = $("counter-text").value;
  if (state.preset === null && !text.trim()) {
    show(refusal("Nothing to count: paste a config.json, drop the file in the box, or pick one above."));
    return;
  }
  if (state.manifest === null) {
    show(refusal("The counter's files are missing from this site: rebuild the book (make book)."));
    return;
  }
  button.disabled = true;
  const cold = state.worker === null;
  status(cold ? `Loading Python (Pyodide ${state.manifest.pyodide}, about 13 MB, once)…` : "Counting…");
  const message = state.preset !== null ? { scope, preset: state.preset } : { scope, text, name: state.name };
  const t0 = performance.now();
  try {
    const answer = await ask(message);
    if (answer.failure) {
      show(refusal(`The counter could not run: ${answer.failure}`));
      status("");
      return;
    }
    show(...result(answer.result, scope));
    const took = ((performance.now() - t0) / 1000).toFixed(2);
    status(answer.loadMs ? `Python loaded and counted in ${took} s` : `Counted in ${took} s`);
  } finally {
    button.disabled = false;
  }
}

function refusal(text) {
  return el("p", { class: "counter-refusal", id: "counter-error" }, text);
}

function table(caption, rows, head) {
  const t = el("table", { class: "table counter-table" }, el("caption", {}, caption));
  t.append(el("thead", {}, el("tr", {}, ...head.map((h, i) => el("th", i ? { class: "num" } : {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, ...r.map((c, i) => el("td", i ? { class: "num" } : {}, c))));
  t.append(body);
  return t;
}

function fmt(n) {
  return typeof n === "number" ? NUM.format(n) : String(n);
}

function pct(x) {
  return `${(100 * x).toPrecision(3)}%`;
}

// The unidentified directions by term, as horizontal bars (a term's share of all of them) labelled with the counts:
// HTML, so that the labels keep the page's font size on a phone.
function bars(byTerm, total) {
  const terms = Object.entries(byTerm).filter(([, v]) => v > 0);
  if (!terms.length || !total) return el("p", {}, "No direction is unidentified.");
  const caption = `Unidentified directions by term, as a share of all ${fmt(total)}`;
  const rows = terms.map(([k, v]) => {
    const bar = el("span", { class: "counter-bar" });
    bar.style.width = `${Math.max(0.5, (100 * v) / total)}%`;
    return el("div", { class: "counter-bar-row" }, el("span", { class: "counter-bar-term" }, k),
      el("span", { class: "counter-bar-track" }, bar), el("span", { class: "counter-bar-value" }, `${fmt(v)} (${pct(v / total)})`));
  });
  return el("figure", { class: "counter-figure", role: "group", "aria-label": caption }, ...rows,
    el("figcaption", {}, caption));
}

function result(r, scope) {
  if (r.status !== 0) return [refusal(r.error || `attnid count stopped (exit status ${r.status})`), command(r)];
  const j = r.json, p = j.params_by_block, u = j.unidentified_by_block;
  const nodes = [el("p", { class: "counter-headline" }, el("strong", {},
    `${fmt(j.total_params)} parameters, ${fmt(j.unidentified)} unidentified (${pct(j.unidentified / j.total_params)})`))];
  const same = JSON.stringify(Object.keys(p)) === JSON.stringify(Object.keys(u));
  if (same) {
    const rows = Object.keys(p).map((k) => [k, fmt(p[k]), fmt(u[k])]);
    rows.push(["total", fmt(j.total_params), fmt(j.unidentified)]);
    nodes.push(table("Parameters and unidentified directions by term", rows, ["term", "parameters", "unidentified"]));
  } else {
    const rows = Object.entries(p).map(([k, v]) => [k, fmt(v)]);
    rows.push(["total", fmt(j.total_params)]);
    nodes.push(table("Parameters by term", rows, ["term", "parameters"]));
    const un = Object.entries(u).map(([k, v]) => [k, fmt(v)]);
    un.push(["total", fmt(j.unidentified)]);
    nodes.push(table("Unidentified directions by term", un, ["term", "unidentified"]));
  }
  nodes.push(bars(u, j.unidentified));
  const heads = j.architecture?.heads;
  if (scope === "attention" && heads && j.architecture.embed) {
    nodes.push(el("p", {}, `Unidentified share of this layer's weights: ${pct(j.unidentified / j.total_params)}; ` +
      `the paper's 1/(2H) for a plain layer of H = ${heads} heads (no RoPE, no GQA, no biases): ${pct(1 / (2 * heads))}.`));
  }
  nodes.push(command(r));
  nodes.push(el("details", { open: "" }, el("summary", {}, "As the command prints it, with what was read"),
    el("pre", { class: "counter-text", id: "counter-printed" }, r.text)));
  nodes.push(el("details", {}, el("summary", {}, "JSON (--json)"),
    el("pre", { class: "counter-text", id: "counter-json" }, JSON.stringify(j, null, 2))));
  return nodes;
}

function command(r) {
  return el("p", { class: "counter-command" }, "On your machine: ", el("code", {}, r.command));
}

function wire() {
  $("counter-run").addEventListener("click", count);
  $("counter-pick").addEventListener("change", (e) => pick(e.target.value));
  $("counter-file").addEventListener("change", (e) => takeFile(e.target.files[0]));
  const box = $("counter-text");
  box.addEventListener("beforeinput", replacedWhole);
  box.addEventListener("input", ownText);
  box.addEventListener("dragover", (e) => e.preventDefault());
  box.addEventListener("drop", (e) => {
    e.preventDefault();
    takeFile(e.dataTransfer.files[0]);
  });
  loadManifest().catch((e) => show(refusal(String(e.message ?? e))));
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", wire);
else wire();
