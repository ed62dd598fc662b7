// The counter page's Python (counter.md): Pyodide and attnid's sources from this site's _counter/ folder (written
// by the book's build, book/_ext/counter.py), loaded at the first message; each message is one Count, answered with
// what attnid.browser.count_page returns. A worker, so that the page stays usable while Python loads and counts.
import { loadPyodide } from "./pyodide/pyodide.mjs";

const BASE = new URL("./", import.meta.url);
const SOURCES = "/home/pyodide/attnid-sources"; // where the package's zip is unpacked, put first on sys.path
let starting = null;

async function start(pkg) {
  const t0 = performance.now();
  const py = await loadPyodide({ indexURL: new URL("pyodide/", BASE).href });
  const r = await fetch(new URL(pkg, BASE));
  if (!r.ok) throw new Error(`${pkg}: ${r.status} ${r.statusText}`);
  py.unpackArchive(new Uint8Array(await r.arrayBuffer()), "zip", { extractDir: SOURCES });
  py.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(SOURCES)}); import attnid.browser`);
  return { count: py.pyimport("attnid.browser").count_page, loadMs: performance.now() - t0 };
}

self.onmessage = async ({ data }) => {
  try {
    starting ??= start(data.package);
    const { count, loadMs } = await starting;
    const t0 = performance.now();
    // only the arguments given: a JavaScript null would reach Python as jsnull, not None
    const given = Object.fromEntries(["text", "name", "preset"].filter((k) => data[k] != null).map((k) => [k, data[k]]));
    const out = count.callKwargs(data.scope, given);
    self.postMessage({ id: data.id, result: JSON.parse(out), loadMs, countMs: performance.now() - t0 });
    starting = Promise.resolve({ count, loadMs: 0 }); // loaded once: later answers report no load time
  } catch (e) {
    starting = null; // a failed start is tried again at the next Count
    self.postMessage({ id: data.id, failure: String(e?.message ?? e).trim().split("\n").pop() });
  }
};
