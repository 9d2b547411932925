// hlotk viewer: pan/zoom HLO graphs laid out in the page, search, expand fusions and called
// computations, a details panel, before/after (or XLA beside hlotk) side by side, and the
// memory timeline. Our own code, no library; the data is the gzip'd JSON in #hlotk-data
// (runtime/viewer/model.py says what is in it).
"use strict";

const T0 = performance.now();
const NODE_H = 34, RANK_GAP = 34, NODE_GAP = 14, DUMMY_W = 6, PAD = 10, HEAD = 22;
const MAX_DUMMIES = 60000;   // past this, the longest edges are drawn straight
const SVGNS = "http://www.w3.org/2000/svg";

function esc(s) {
  return String(s).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}
function human(n) {
  if (n === undefined || n === null) return "";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let k = 0, v = n;
  while (v >= 1024 && k < u.length - 1) { v /= 1024; k++; }
  return (k ? v.toFixed(v < 10 ? 2 : 1) : String(v)) + " " + u[k];
}
function $(id) { return document.getElementById(id); }

async function loadData() {
  const b64 = $("hlotk-data").textContent.trim();
  const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

// --- a module snapshot: lookups -----------------------------------------------------------
class Snapshot {
  constructor(s, index) {
    Object.assign(this, s);
    this.index = index;
    this.where = new Map();     // instruction name -> [comp index, node index]
    this.callers = new Map();   // comp index -> [comp index, node index] of its first caller
    this.users = new Map();     // "ci/ni" -> [ni...]
    this.comps.forEach((c, ci) => c.nodes.forEach((n, ni) => {
      if (!this.where.has(n.n)) this.where.set(n.n, [ci, ni]);
      for (const callee of n.c || []) if (!this.callers.has(callee)) this.callers.set(callee, [ci, ni]);
      for (const o of n.in) {
        const key = ci + "/" + o;
        if (!this.users.has(key)) this.users.set(key, []);
        this.users.get(key).push(ni);
      }
    }));
    this.structures = new Map();
  }
  node(name) { const w = this.where.get(name); return w ? this.comps[w[0]].nodes[w[1]] : null; }
  // Call-site instruction names from the entry down to the computation holding ``name``.
  ancestors(name) {
    const out = [];
    let w = this.where.get(name);
    const seen = new Set();
    while (w && w[0] !== this.entry && !seen.has(w[0])) {
      seen.add(w[0]);
      const c = this.callers.get(w[0]);
      if (!c) break;
      out.unshift(this.comps[c[0]].nodes[c[1]].n);
      w = c;
    }
    return out;
  }
}

// --- layered layout ----------------------------------------------------------------------
// Structure (ranks, dummy nodes, order) depends only on the graph: computed once per
// computation. Coordinates depend on node sizes (an expanded node is as big as its body):
// recomputed, cheaply, when something is expanded or collapsed.
function structure(comp) {
  const nodes = comp.nodes, n = nodes.length;
  const rank = new Int32Array(n), users = Array.from({length: n}, () => []);
  for (let v = 0; v < n; v++) {
    let r = 0;
    for (const u of nodes[v].in) { users[u].push(v); if (rank[u] + 1 > r) r = rank[u] + 1; }
    rank[v] = r;
  }
  // Then as late as their users allow: parameters, constants and values computed early
  // for late use sit just above their first user (shorter edges, narrower ranks).
  for (let v = n - 1; v >= 0; v--) {
    if (users[v].length) {
      let r = Infinity;
      for (const w of users[v]) r = Math.min(r, rank[w]);
      if (r - 1 > rank[v]) rank[v] = r - 1;
    }
  }
  const edges = [];   // [u, v, operand index]
  nodes.forEach((nd, v) => nd.in.forEach((u, k) => edges.push([u, v, k])));
  let dummies = 0;
  const spans = edges.map(e => rank[e[1]] - rank[e[0]] - 1);
  let maxSpan = Infinity;
  const total = spans.reduce((a, s) => a + Math.max(0, s), 0);
  if (total > MAX_DUMMIES) {
    const sorted = spans.filter(s => s > 0).sort((a, b) => a - b);
    let acc = 0, k = 0;
    while (k < sorted.length && acc + sorted[k] <= MAX_DUMMIES) acc += sorted[k++];
    maxSpan = k < sorted.length ? sorted[k] - 1 : Infinity;
  }
  const nr = n ? Math.max(...rank) + 1 : 0;
  const ranks = Array.from({length: nr}, () => []);
  // items: node ids 0..n-1, then dummies n.. ; up/down adjacency between adjacent ranks
  const itemRank = Array.from(rank), up = Array.from({length: n}, () => []), down = Array.from({length: n}, () => []);
  const chains = [];   // per edge: list of item ids from u to v (dummies in between), or null (straight)
  for (let e = 0; e < edges.length; e++) {
    const [u, v] = edges[e];
    if (spans[e] > maxSpan) { chains.push(null); continue; }
    const chain = [u];
    for (let r = rank[u] + 1; r < rank[v]; r++) {
      const d = n + dummies++;
      itemRank.push(r); up.push([]); down.push([]);
      chain.push(d);
    }
    chain.push(v);
    for (let k = 0; k + 1 < chain.length; k++) { down[chain[k]].push(chain[k + 1]); up[chain[k + 1]].push(chain[k]); }
    chains.push(chain);
  }
  for (let i = 0; i < itemRank.length; i++) ranks[itemRank[i]].push(i);
  // Barycenter sweeps: order each rank by the mean position of its neighbours.
  const pos = new Float64Array(itemRank.length);
  const setPos = r => ranks[r].forEach((it, k) => { pos[it] = k; });
  for (let r = 0; r < nr; r++) setPos(r);
  const sweep = (r, adj) => {
    const key = new Map();
    for (const it of ranks[r]) {
      const nb = adj[it];
      key.set(it, nb.length ? nb.reduce((a, x) => a + pos[x], 0) / nb.length : pos[it]);
    }
    ranks[r].sort((a, b) => key.get(a) - key.get(b));
    setPos(r);
  };
  for (let iter = 0; iter < 4; iter++) {
    for (let r = 1; r < nr; r++) sweep(r, up);
    for (let r = nr - 2; r >= 0; r--) sweep(r, down);
  }
  return {n, rank, ranks, up, down, edges, chains, items: itemRank.length};
}

function nodeSize(nd) {
  const l1 = nd.n.length, l2 = Math.min(nd.op.length + 1 + nd.sh.length, 40);
  return [Math.max(56, Math.min(280, 7 * Math.max(l1, l2) + 14)), NODE_H];
}

// Coordinates for one computation given each node's [w, h]; returns positions (centres).
function coordinates(st, sizes) {
  const {n, ranks, up, down} = st;
  const w = i => i < n ? sizes[i][0] : DUMMY_W, h = i => i < n ? sizes[i][1] : 0;
  const x = new Float64Array(st.items), y = new Float64Array(st.items);
  let top = 0;
  const rankTop = [], rankH = [];
  for (const items of ranks) {
    let mh = 8;
    for (const it of items) mh = Math.max(mh, h(it));
    rankTop.push(top); rankH.push(mh);
    top += mh + RANK_GAP;
  }
  const place = (items, desired) => {
    const m = items.length, L = new Float64Array(m), R = new Float64Array(m);
    for (let k = 0; k < m; k++) {
      L[k] = desired[k];
      if (k) L[k] = Math.max(L[k], L[k - 1] + (w(items[k - 1]) + w(items[k])) / 2 + NODE_GAP);
    }
    for (let k = m - 1; k >= 0; k--) {
      R[k] = desired[k];
      if (k < m - 1) R[k] = Math.min(R[k], R[k + 1] - (w(items[k + 1]) + w(items[k])) / 2 - NODE_GAP);
    }
    for (let k = 0; k < m; k++) x[items[k]] = (L[k] + R[k]) / 2;
  };
  ranks.forEach(items => { let acc = 0; place(items, items.map(it => { const c = acc + w(it) / 2; acc += w(it) + NODE_GAP; return c; })); });
  const mean = (it, adj) => { const nb = adj[it]; return nb.length ? nb.reduce((a, b) => a + x[b], 0) / nb.length : x[it]; };
  for (let iter = 0; iter < 3; iter++) {
    for (let r = 1; r < ranks.length; r++) place(ranks[r], ranks[r].map(it => mean(it, up)));
    for (let r = ranks.length - 2; r >= 0; r--) place(ranks[r], ranks[r].map(it => mean(it, down)));
  }
  let minX = Infinity, maxX = -Infinity;
  for (let it = 0; it < st.items; it++) { minX = Math.min(minX, x[it] - w(it) / 2); maxX = Math.max(maxX, x[it] + w(it) / 2); }
  if (!st.items) { minX = 0; maxX = 0; }
  for (let it = 0; it < st.items; it++) {
    x[it] -= minX;
    y[it] = it < n ? rankTop[st.rank[it]] + h(it) / 2 : 0;
  }
  ranks.forEach((items, r) => items.forEach(it => { if (it >= n) y[it] = rankTop[r] + rankH[r] / 2; }));
  return {x, y, W: maxX - minX, H: Math.max(0, top - RANK_GAP)};
}

// --- one graph pane ----------------------------------------------------------------------
class GraphView {
  constructor(el, app, snap, marks, side) {
    this.el = el; this.app = app; this.snap = snap; this.marks = marks || {}; this.side = side;
    this.expanded = new Set();
    this.k = 1; this.tx = 20; this.ty = 20;
    this.selected = null; this.hits = new Set();
    el.innerHTML = "";
    this.svg = document.createElementNS(SVGNS, "svg");
    this.svg.setAttribute("class", "graph");
    this.vp = document.createElementNS(SVGNS, "g");
    this.svg.appendChild(this.vp);
    el.appendChild(this.svg);
    this.markedInside = this.insideMarks();
    this.bindEvents();
  }
  // Computations holding a marked instruction: their call sites get a dot when collapsed.
  insideMarks() {
    const out = new Set();
    for (const name of Object.keys(this.marks)) {
      for (const a of this.snap.ancestors(name)) out.add(a);
    }
    return out;
  }
  layoutComp(ci) {
    const snap = this.snap, comp = snap.comps[ci];
    if (!snap.structures.has(ci)) snap.structures.set(ci, structure(comp));
    const st = snap.structures.get(ci);
    const children = new Map(), sizes = comp.nodes.map((nd, i) => {
      if (nd.c && this.expanded.has(nd.n)) {
        const subs = nd.c.map(c => this.layoutComp(c));
        children.set(i, subs);
        const wsum = subs.reduce((a, s) => a + s.W, 0) + PAD * (subs.length + 1);
        const hmax = subs.reduce((a, s) => Math.max(a, s.H), 0);
        return [Math.max(wsum, nodeSize(nd)[0]), hmax + HEAD + 2 * PAD];
      }
      return nodeSize(nd);
    });
    const co = coordinates(st, sizes);
    return {ci, st, sizes, children, ...co};
  }
  render() {
    const t = performance.now();
    this.layout = this.layoutComp(this.snap.entry);
    const parts = [];
    this.emit(this.layout, parts);
    this.vp.innerHTML = parts.join("");
    this.applyTransform();
    this.refreshClasses();
    this.renderMs = performance.now() - t;
    return this.renderMs;
  }
  emit(L, out) {
    const comp = this.snap.comps[L.ci], n = L.st.n, {x, y, sizes} = L;
    // edges first, under the nodes
    L.st.edges.forEach(([u, v], e) => {
      const chain = L.st.chains[e] || [u, v];
      const pts = chain.map((it, k) => {
        if (it >= n) return [x[it], y[it]];
        const hh = sizes[it][1] / 2;
        return [x[it], k === 0 ? y[it] + hh : y[it] - hh];
      });
      let d = `M${pts[0][0].toFixed(1)},${pts[0][1].toFixed(1)}`;
      for (let k = 1; k < pts.length; k++) {
        const [ax, ay] = pts[k - 1], [bx, by] = pts[k], my = (ay + by) / 2;
        d += `C${ax.toFixed(1)},${my.toFixed(1)} ${bx.toFixed(1)},${my.toFixed(1)} ${bx.toFixed(1)},${by.toFixed(1)}`;
      }
      out.push(`<path class="e" data-from="${esc(comp.nodes[u].n)}" data-to="${esc(comp.nodes[v].n)}" d="${d}"/>`);
    });
    const cats = this.app.data.categories;
    comp.nodes.forEach((nd, i) => {
      const [w, h] = sizes[i], left = x[i] - w / 2, top = y[i] - h / 2;
      const mark = this.marks[nd.n] || "";
      const cls = ["node", mark, nd.c ? "has-calls" : "", this.markedInside.has(nd.n) ? "inner-mark" : ""].join(" ");
      out.push(`<g class="${cls}" data-name="${esc(nd.n)}" transform="translate(${left.toFixed(1)},${top.toFixed(1)})">`);
      const sub = L.children.get(i);
      const fill = cats[nd.k] ? cats[nd.k][1] : "#fff";
      if (sub) {
        out.push(`<rect class="box" width="${w.toFixed(1)}" height="${h.toFixed(1)}" rx="6"/>`);
        out.push(`<text class="hd" x="8" y="15">${esc(nd.n)} · ${esc(nd.fk || nd.op)}</text>`);
        out.push(`<g class="tg" data-name="${esc(nd.n)}" transform="translate(${(w - 18).toFixed(1)},3)"><rect width="15" height="15" rx="3"/><text x="7.5" y="12">−</text></g>`);
        let ox = PAD + Math.max(0, (w - (sub.reduce((a, s) => a + s.W, 0) + PAD * (sub.length + 1))) / 2);
        for (const s of sub) {
          out.push(`<g transform="translate(${ox.toFixed(1)},${HEAD + PAD})">`);
          out.push(`<text class="cn" x="0" y="-4">%${esc(this.snap.comps[s.ci].name)}</text>`);
          this.emit(s, out);
          out.push("</g>");
          ox += s.W + PAD;
        }
      } else {
        const shape = nd.op === "parameter" ? ` rx="16"` : ` rx="3"`;
        const label2 = (nd.op === "fusion" || nd.op === "custom-call") && nd.fk ? nd.fk : nd.op;
        let sh = nd.sh.replace(/\{[^}]*\}/g, "");
        const room = Math.max(4, Math.floor((w - 14) / 6.2) - label2.length - 1);
        if (sh.length > room) sh = sh.slice(0, room - 1) + "…";
        out.push(`<rect class="nb" width="${w.toFixed(1)}" height="${h}"${shape} style="fill:${fill}"/>`);
        out.push(`<text x="${(w / 2).toFixed(1)}" y="14">${esc(nd.n)}</text>`);
        out.push(`<text class="sub" x="${(w / 2).toFixed(1)}" y="27">${esc(label2)} ${esc(sh)}</text>`);
        if (nd.c) out.push(`<g class="tg" data-name="${esc(nd.n)}" transform="translate(${(w - 13).toFixed(1)},-6)"><rect width="15" height="15" rx="3"/><text x="7.5" y="12">+</text></g>`);
      }
      out.push("</g>");
    });
  }
  applyTransform() {
    this.vp.setAttribute("transform", `translate(${this.tx},${this.ty}) scale(${this.k})`);
    this.svg.classList.toggle("lod", this.k < 0.35);
  }
  fit() {
    const r = this.el.getBoundingClientRect(), L = this.layout;
    if (!L || !L.W || !L.H) return;
    this.k = Math.min(1.2, Math.max(0.02, Math.min((r.width - 40) / L.W, (r.height - 40) / L.H)));
    this.tx = (r.width - L.W * this.k) / 2; this.ty = 20;
    // Big graphs: start at the top at a readable zoom, centred on where most nodes are,
    // instead of a thumbnail.
    if (this.k < 0.25) {
      const xs = Array.from(L.x.subarray(0, L.st.n)).sort((a, b) => a - b);
      this.k = 0.6;
      this.tx = r.width / 2 - (xs.length ? xs[xs.length >> 1] : 0) * this.k;
    }
    this.applyTransform();
  }
  bindEvents() {
    let drag = null;
    this.svg.addEventListener("wheel", ev => {
      ev.preventDefault();
      const r = this.svg.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      const f = Math.exp(-ev.deltaY * 0.0015), k = Math.min(4, Math.max(0.01, this.k * f));
      this.tx = px - (px - this.tx) * k / this.k; this.ty = py - (py - this.ty) * k / this.k; this.k = k;
      this.applyTransform();
    }, {passive: false});
    this.svg.addEventListener("mousedown", ev => { drag = [ev.clientX, ev.clientY, this.tx, this.ty, false]; });
    window.addEventListener("mousemove", ev => {
      if (!drag) return;
      const dx = ev.clientX - drag[0], dy = ev.clientY - drag[1];
      if (Math.abs(dx) + Math.abs(dy) > 3) drag[4] = true;
      this.tx = drag[2] + dx; this.ty = drag[3] + dy; this.applyTransform();
    });
    window.addEventListener("mouseup", () => { setTimeout(() => { drag = null; }, 0); });
    this.svg.addEventListener("click", ev => {
      if (drag && drag[4]) return;
      const tg = ev.target.closest(".tg");
      if (tg) { this.toggle(tg.dataset.name); return; }
      const g = ev.target.closest(".node");
      if (g) this.app.select(g.dataset.name, this.side);
    });
    this.svg.addEventListener("dblclick", ev => {
      const g = ev.target.closest(".node.has-calls");
      if (g) this.toggle(g.dataset.name);
    });
  }
  toggle(name, open) {
    const isOpen = this.expanded.has(name);
    if (open === undefined) open = !isOpen;
    if (open === isOpen) return;
    if (open) this.expanded.add(name); else this.expanded.delete(name);
    this.render();
    if (this.selected) this.app.showPanel();
  }
  reveal(name) {
    const anc = this.snap.ancestors(name).filter(a => !this.expanded.has(a));
    if (anc.length) { anc.forEach(a => this.expanded.add(a)); this.render(); }
  }
  elementsOf(name) { return this.vp.querySelectorAll(`.node[data-name="${CSS.escape(name)}"]`); }
  center(name) {
    const els = this.elementsOf(name);
    if (!els.length) return;
    const b = els[0].getBoundingClientRect(), r = this.svg.getBoundingClientRect();
    if (this.k < 0.5) {  // zoom in around it first
      const f = 0.8 / this.k;
      this.k = 0.8; this.tx = r.width / 2 - ((b.left + b.width / 2 - r.left) - this.tx) * f;
      this.ty = r.height / 2 - ((b.top + b.height / 2 - r.top) - this.ty) * f;
    } else {
      this.tx += r.width / 2 - (b.left + b.width / 2 - r.left);
      this.ty += r.height / 2 - (b.top + b.height / 2 - r.top);
    }
    this.applyTransform();
  }
  setSelected(name) { this.selected = name; this.refreshClasses(); }
  refreshClasses() {
    this.vp.querySelectorAll(".node.sel, .node.hit, .e.sel").forEach(e => e.classList.remove("sel", "hit"));
    for (const h of this.hits) this.elementsOf(h).forEach(e => e.classList.add("hit"));
    if (this.selected) {
      this.elementsOf(this.selected).forEach(e => e.classList.add("sel"));
      const q = CSS.escape(this.selected);
      this.vp.querySelectorAll(`.e[data-from="${q}"], .e[data-to="${q}"]`).forEach(e => e.classList.add("sel"));
    }
  }
}

// --- the memory timeline -----------------------------------------------------------------
class MemoryView {
  constructor(el, app, mem) {
    this.el = el; this.app = app; this.mem = mem;
    const W = 1200, top = 70, H = 240, steps = Math.max(1, mem.steps.length), arena = Math.max(1, mem.arena);
    const sx = W / steps, sy = H / arena, peakLive = Math.max(1, ...mem.live);
    const parts = [`<svg class="memsvg" viewBox="0 0 ${W} ${top + H + 16}" preserveAspectRatio="none">`];
    const pts = mem.live.map((v, t) => `${(t * sx + sx / 2).toFixed(1)},${(top - 6 - (top - 16) * v / peakLive).toFixed(1)}`);
    parts.push(`<polyline class="live" points="${pts.join(" ")}"/>`);
    parts.push(`<text x="4" y="12">live temp bytes (peak ${human(mem.peak[1])} at step ${mem.peak[0]}: ${esc(mem.peak[2].join(", "))})</text>`);
    parts.push(`<rect class="arena" x="0" y="${top}" width="${W}" height="${H}"/>`);
    mem.buffers.forEach((b, i) => {
      const [name, prod, size, off, s, e] = b;
      parts.push(`<rect class="buf" data-i="${i}" data-producer="${esc(prod)}" x="${(s * sx).toFixed(2)}" y="${(top + off * sy).toFixed(2)}" width="${Math.max(1, (e - s + 1) * sx).toFixed(2)}" height="${Math.max(1, size * sy).toFixed(2)}"><title>${esc(name)} ${human(size)} @${off} steps ${s}-${e}</title></rect>`);
    });
    parts.push(`<text x="4" y="${top + H + 13}">arena ${human(mem.arena)} (lower bound ${human(mem.lower)}), ${mem.buffers.length} buffers over ${steps} schedule steps; click a buffer to see its producer</text>`);
    parts.push("</svg>");
    el.innerHTML = parts.join("");
    el.addEventListener("click", ev => {
      const r = ev.target.closest(".buf");
      if (r) app.selectBuffer(+r.dataset.i);
    });
  }
  highlight(producer, index) {
    this.el.querySelectorAll(".buf.sel").forEach(e => e.classList.remove("sel"));
    this.el.querySelectorAll(".buf").forEach(e => {
      if ((index !== undefined && +e.dataset.i === index) || (index === undefined && e.dataset.producer === producer)) e.classList.add("sel");
    });
  }
}

// --- the application ---------------------------------------------------------------------
class App {
  constructor(data) {
    this.data = data;
    this.snaps = data.snapshots.map((s, i) => new Snapshot(s, i));
    this.views = {};
    this.pair = null;
    this.selection = null;   // {name, side}
    this.buffer = null;
    $("title").textContent = data.title;
    document.title = data.title;
    const sel = $("view");
    const opts = [];
    data.pairs.forEach((p, i) => opts.push(`<option value="p${i}">${esc(p.label)}</option>`));
    this.snaps.forEach((s, i) => opts.push(`<option value="s${i}">${esc(s.label)} (${s.instructions} instructions)</option>`));
    sel.innerHTML = opts.join("");
    sel.addEventListener("change", () => this.show(sel.value));
    $("search").addEventListener("input", () => { clearTimeout(this.st); this.st = setTimeout(() => this.search(), 120); });
    $("search").addEventListener("keydown", ev => {
      if (ev.key === "Enter") { const h = $("results").querySelector(".hit"); if (h) h.click(); }
    });
    $("results").addEventListener("click", ev => {
      const h = ev.target.closest(".hit");
      if (h) this.select(h.dataset.name, h.dataset.side, true);
    });
    $("panel").addEventListener("click", ev => {
      const a = ev.target.closest("[data-goto]");
      if (a) { this.select(a.dataset.goto, a.dataset.side || this.selection.side, true); return; }
      const t = ev.target.closest("[data-toggle]");
      if (t) { this.views[t.dataset.side].toggle(t.dataset.toggle); }
    });
    $("fit").addEventListener("click", () => Object.values(this.views).forEach(v => v.fit()));
    $("collapse").addEventListener("click", () => Object.values(this.views).forEach(v => { v.expanded.clear(); v.render(); }));
    if (data.memory) {
      $("membtn").addEventListener("click", () => this.toggleMemory());
    } else {
      $("membtn").disabled = true; $("membtn").title = "no buffer assignment (module not scheduled)";
    }
    $("notes").innerHTML = `<div class="legend">` + data.categories.map(([name, color]) =>
      `<span style="background:${color}">${esc(name)}</span>`).join("") +
      ` borders: <b style="color:#16a34a">added</b> <b style="color:#ea580c">changed</b> <b style="color:#dc2626">removed</b></div>` +
      (data.notes || []).map(n => `<div>${esc(n)}</div>`).join("");
  }
  show(value) {
    const main = $("main");
    this.views = {};
    main.innerHTML = "";
    this.pair = null;
    const pane = (side, snap, marks, heading) => {
      const d = document.createElement("div");
      d.className = "pane"; d.id = "pane-" + side;
      d.innerHTML = `<div class="ph">${esc(heading)}</div><div class="gv"></div>`;
      main.appendChild(d);
      const v = new GraphView(d.querySelector(".gv"), this, snap, marks, side);
      this.views[side] = v;
      return v;
    };
    if (value[0] === "p") {
      const p = this.data.pairs[+value.slice(1)];
      this.pair = p;
      const l = this.snaps[p.left], r = this.snaps[p.right];
      pane("L", l, p.marksL, `${l.label} · ${l.instructions} instructions, ${l.kernels} kernels`);
      pane("R", r, p.marksR, `${r.label} · ${r.instructions} instructions, ${r.kernels} kernels`);
      $("pairnote").textContent = (p.notes || []).join(" · ") + (p.ms !== undefined ? ` · ${p.ms} ms` : "");
    } else {
      const s = this.snaps[+value.slice(1)];
      pane("L", s, {}, `${s.label} · ${s.instructions} instructions, ${s.kernels} kernels` + (s.target ? ` · predictions for ${s.target}` : ""));
      $("pairnote").textContent = "";
    }
    for (const v of Object.values(this.views)) { v.render(); v.fit(); }
    if (this.selection) {
      const {name} = this.selection;
      this.selection = null;
      this.select(name, "L", true, true);
    }
    this.search();
  }
  // The name on ``side`` that corresponds to ``name`` selected on the other side.
  counterpart(name, from, to) {
    const p = this.pair;
    if (!p) return name;
    const gFrom = from === "L" ? p.groupsL : p.groupsR, gTo = to === "L" ? p.groupsL : p.groupsR;
    if (!gFrom) {
      const other = this.views[to].snap;
      if (other.where.has(name)) return name;
      // A fusion the pass made (or unmade): the other side's instruction is its root's
      // namesake (fusion bodies keep the names of the instructions they fused).
      const mine = this.views[from].snap, nd = mine.node(name);
      if (nd && nd.op === "fusion" && nd.c) {
        const root = mine.comps[nd.c[0]].nodes.find(n => n.root);
        if (root && other.where.has(root.n)) return root.n;
      }
      return null;
    }
    const g = gFrom[name];
    if (g === undefined) return null;
    const names = Object.keys(gTo).filter(n => gTo[n] === g);
    const snap = this.views[to].snap;
    // prefer an entry-level instruction (the kernel) over its body's
    names.sort((a, b) => snap.ancestors(a).length - snap.ancestors(b).length);
    return names[0] || null;
  }
  select(name, side, reveal, quiet) {
    side = side || "L";
    if (!this.views[side]) side = "L";
    this.selection = {name, side};
    for (const [s, v] of Object.entries(this.views)) {
      const other = s === side ? name : this.counterpart(name, side, s);
      if (other && v.snap.where.has(other)) {
        if (reveal || s !== side) v.reveal(other);
        v.setSelected(other);
        if (reveal || s !== side) v.center(other);
      } else {
        v.setSelected(null);
      }
    }
    if (this.mem && !quiet) this.mem.highlight(name);
    this.showPanel();
  }
  showPanel() {
    if (!this.selection) return;
    const {name, side} = this.selection, v = this.views[side];
    if (!v) return;
    const snap = v.snap, nd = snap.node(name);
    if (!nd) { $("panel").innerHTML = `<p>%${esc(name)} is not in ${esc(snap.label)}</p>`; return; }
    const [ci, ni] = snap.where.get(name), comp = snap.comps[ci];
    const rows = [["opcode", esc(nd.op) + (nd.fk ? ` (${esc(nd.fk)})` : "")], ["shape", esc(nd.sh)],
      ["bytes", `<span id="p-bytes">${nd.b} (${human(nd.b)})</span>`], ["computation", "%" + esc(comp.name)]];
    if (nd.src) rows.push(["source", `<span id="p-source">${esc(nd.src)}</span>`]);
    if (nd.on) rows.push(["op_name", esc(nd.on)]);
    if (nd.pred !== undefined) rows.push(["predicted", `<span id="p-pred">${nd.pred} µs</span>` + (nd.mb !== undefined ? `, moves ${human(nd.mb)}` : "") + (snap.target ? ` (${esc(snap.target)})` : "")]);
    if (nd.us !== undefined) rows.push(["measured", `<span id="p-measured">${nd.us} µs</span>`]);
    const mark = (side === "L" ? (this.pair || {}).marksL : (this.pair || {}).marksR) || {};
    if (mark[name]) rows.push(["diff", `<span class="badge ${mark[name]}">${mark[name]}</span>`]);
    const link = (n, s) => `<a data-goto="${esc(n)}" data-side="${s || side}">%${esc(n)}</a>`;
    const ops = nd.in.map(o => link(comp.nodes[o].n)).join(", ");
    const users = (snap.users.get(ci + "/" + ni) || []).map(u => link(comp.nodes[u].n)).join(", ");
    if (ops) rows.push(["operands", ops]);
    if (users) rows.push(["users", users]);
    if (nd.c) rows.push(["calls", nd.c.map(c => "%" + esc(snap.comps[c].name)).join(", ") +
      ` <button data-toggle="${esc(name)}" data-side="${side}">${v.expanded.has(name) ? "collapse" : "expand"}</button>`]);
    const anc = snap.ancestors(name);
    if (anc.length) rows.push(["inside", anc.map(a => link(a)).join(" › ")]);
    let html = `<h3 id="p-name">%${esc(name)}</h3><table class="kv">` + rows.map(([k, val]) => `<tr><th>${k}</th><td>${val}</td></tr>`).join("") + "</table>";
    html += `<div class="lbl">HLO</div><pre id="p-hlo">${esc(nd.t)}</pre>`;
    if (nd.fd) {
      const fd = nd.fd, row = r => `<tr><td>%${esc(r[0])} → %${esc(r[1])}</td><td>${esc(r[2])}</td><td>${r[4] || "-"}</td><td>${r[5] || "-"}</td><td>${esc(r[3])}</td></tr>`;
      html += `<div class="lbl">fusion decisions (${esc(fd.policy)}, ${esc(fd.target)})</div><div id="p-fusion">`;
      html += `<table class="fd"><tr><th>edge</th><th>action</th><th>unfused µs</th><th>fused µs</th><th>reason</th></tr>`;
      if (fd.fused.length) html += `<tr><td colspan=5 class="grp">fused into this kernel</td></tr>` + fd.fused.map(row).join("");
      if (fd.apart.length) html += `<tr><td colspan=5 class="grp">left apart at its boundary</td></tr>` + fd.apart.map(row).join("");
      html += "</table></div>";
    }
    if (this.pair) {
      const otherSide = side === "L" ? "R" : "L", other = this.counterpart(name, side, otherSide);
      const on = other && this.views[otherSide].snap.node(other);
      html += `<div class="lbl">other side</div>` + (on ? `<div>${link(other, otherSide)}</div><pre id="p-other">${esc(on.t)}</pre>` : `<div id="p-other">not present</div>`);
    }
    $("panel").innerHTML = html;
  }
  search() {
    const q = $("search").value.trim().toLowerCase();
    const out = [];
    let count = 0;
    for (const [side, v] of Object.entries(this.views)) {
      v.hits = new Set();
      if (!q) { v.refreshClasses(); continue; }
      v.snap.comps.forEach(c => c.nodes.forEach(nd => {
        if (nd.n.toLowerCase().includes(q) || nd.op.toLowerCase() === q || nd.op.toLowerCase().includes(q) || (nd.on && nd.on.toLowerCase().includes(q))) {
          v.hits.add(nd.n);
          count++;
          const where = this.pair ? `<span class="dim">${side === "L" ? "left" : "right"}:</span> ` : "";
          if (out.length < 200) out.push(`<div class="hit" data-name="${esc(nd.n)}" data-side="${side}">${where}<b>%${esc(nd.n)}</b> ${esc(nd.op)} <span class="dim">${esc(c.name)}${nd.on ? " · " + esc(nd.on) : ""}</span></div>`);
        }
      }));
      v.refreshClasses();
    }
    $("results").innerHTML = q ? `<div class="dim">${count} match${count === 1 ? "" : "es"}${count > 200 ? " (first 200)" : ""}</div>` + out.join("") : "";
  }
  toggleMemory() {
    const el = $("mem");
    if (el.style.display === "block") { el.style.display = "none"; return; }
    el.style.display = "block";
    if (!this.mem) this.mem = new MemoryView(el, this, this.data.memory);
  }
  selectBuffer(i) {
    const b = this.data.memory.buffers[i], snapIndex = this.data.memory.snapshot;
    const v = this.views.L;
    if (!v || v.snap.index !== snapIndex || this.pair) { $("view").value = "s" + snapIndex; this.show("s" + snapIndex); }
    this.select(b[1], "L", true, true);
    this.mem.highlight(b[1], i);
    const info = `<div id="p-buffer" class="bufinfo"><b>buffer ${esc(b[0])}</b>: ${human(b[2])} at offset ${b[3]}, live over schedule steps ${b[4]}–${b[5]} (%${esc(this.data.memory.steps[b[4]] || "")} … %${esc(this.data.memory.steps[b[5]] || "")}); produced by %${esc(b[1])}</div>`;
    $("panel").insertAdjacentHTML("afterbegin", info);
  }
}

(async () => {
  try {
    const t1 = performance.now();
    const data = await loadData();
    const t2 = performance.now();
    const app = new App(data);
    window.hlotkApp = app;
    app.show($("view").value);
    const t3 = performance.now();
    requestAnimationFrame(() => setTimeout(() => {
      const t4 = performance.now();
      window.hlotkTiming = {decode_ms: t2 - t1, layout_and_render_ms: t3 - t2, first_paint_ms: t4,
                            script_ms: t4 - T0, nodes: app.views.L ? app.views.L.snap.instructions : 0};
      document.body.dataset.ready = "1";
    }, 0));
  } catch (e) {
    document.body.dataset.ready = "error";
    $("main").innerHTML = `<pre class="err">viewer failed: ${esc(e && e.stack || e)}</pre>`;
    throw e;
  }
})();
