// agentenv view: plain JS, no build step, nothing fetched from outside this server.
"use strict";

const $ = (id) => document.getElementById(id);
const SVGNS = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const CURVES = [
  { title: "reward", keys: ["rollout/reward"] },
  { title: "accuracy", keys: ["rollout/accuracy"], unit: true },
  { title: "held-out accuracy", keys: ["eval/accuracy"], eval: true, unit: true },
  { title: "entropy", keys: ["rollout/entropy"] },
  { title: "tool calls / trajectory", keys: ["rollout/tool_calls_per_traj"] },
  { title: "step time split (s)", keys: ["time/rollout_s", "time/old_logprobs_s", "time/update_s", "time/push_s"],
    labels: ["rollout", "old logprobs", "update", "push"] },
];
const PAGE = 20;
const REFRESH_S = Number(new URLSearchParams(location.search).get("refresh")) || 5;  // a live run's poll interval

const state = {
  info: null, run: ".", steps: [], step: null, groups: [], total: 0, offset: 0,
  problems: { info: [], metrics: [], steps: [], groups: [] },
};

// ---------------------------------------------------------------- helpers
function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v);
  }
  for (const kid of kids) if (kid !== null && kid !== undefined) e.append(kid);
  return e;
}
function svg(tag, attrs = {}) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}
function fmt(x, d = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (Math.abs(x) >= 1000) return x.toFixed(0);
  return Number(x.toFixed(d)).toString();
}
async function api(path) {
  let res;
  try {
    res = await fetch(path);
  } catch (e) {
    return { data: null, problems: [`the viewer's server does not answer (${e.message}): is agentenv view still running?`] };
  }
  try {
    return await res.json();
  } catch (e) {
    return { data: null, problems: [`${path}: the server answered ${res.status} with no JSON`] };
  }
}
function q(params) {
  return Object.entries(params).map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`).join("&");
}
function showProblems() {
  const all = [...state.problems.info, ...state.problems.metrics, ...state.problems.steps, ...state.problems.groups];
  const box = $("problems");
  box.replaceChildren(...[...new Set(all)].map((p) => el("div", { text: p })));
  box.hidden = all.length === 0;
}

// ---------------------------------------------------------------- charts
function chart(title, series, opts = {}) {
  const W = 340, H = 190, L = 44, R = 10, T = 24, B = 26;
  const box = el("div", { class: "chart", "data-title": title });
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title });
  box.append(s);
  const t = svg("text", { x: L, y: 15, class: "chart-title" });
  t.textContent = title;
  s.append(t);
  const pts = series.flatMap((se) => se.points.filter((p) => p[1] !== null));
  const bandPts = series.flatMap((se) => (se.band || []).flatMap((b) => [[b[0], b[1]], [b[0], b[2]]]).filter((p) => p[1] !== null));
  if (pts.length === 0) {
    const e = svg("text", { x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle" });
    e.textContent = opts.empty || "no data yet";
    s.append(e);
    return box;
  }
  const all = pts.concat(bandPts);
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => p[1])), y1 = Math.max(...all.map((p) => p[1]));
  if (opts.zero) y0 = Math.min(0, y0);
  if (x1 === x0) { x0 -= 1; x1 += 1; }
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.06;
  if (!(opts.zero && y0 === 0)) y0 -= pad;
  y1 += pad;
  if (opts.unit) { y0 = 0; y1 = 1; }  // a share: its whole range, so two runs' charts compare at a glance
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 3; i++) {  // grid and y ticks
    const v = y0 + ((y1 - y0) * i) / 3;
    s.append(svg("line", { x1: L, x2: W - R, y1: Y(v), y2: Y(v), class: "grid" }));
    const tx = svg("text", { x: L - 4, y: Y(v) + 3, class: "tick", "text-anchor": "end" });
    tx.textContent = fmt(v, 2);
    s.append(tx);
  }
  for (const v of [x0, x1]) {
    const tx = svg("text", { x: X(v), y: H - 8, class: "tick", "text-anchor": "middle" });
    tx.textContent = fmt(v, 0);
    s.append(tx);
  }
  const xl = svg("text", { x: (L + W - R) / 2, y: H - 8, class: "tick", "text-anchor": "middle" });
  xl.textContent = "step";
  s.append(xl);
  series.forEach((se, i) => {
    const color = se.color || PALETTE[i % PALETTE.length];
    if (se.band && se.band.length > 1) {
      const ok = se.band.filter((b) => b[1] !== null && b[2] !== null);
      const d = ok.map((b, j) => `${j ? "L" : "M"}${X(b[0])},${Y(b[2])}`).join("") +
        ok.slice().reverse().map((b) => `L${X(b[0])},${Y(b[1])}`).join("") + "Z";
      s.append(svg("path", { d, fill: color, opacity: 0.15, class: "band" }));
    }
    let d = "", pen = false;
    for (const [x, y] of se.points) {
      if (y === null) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${X(x)},${Y(y)}`;
      pen = true;
    }
    s.append(svg("path", { d, fill: "none", stroke: color, "stroke-width": 1.8, class: "line" }));
    if (se.points.length <= 40) {
      for (const [x, y] of se.points) {
        if (y === null) continue;
        const c = svg("circle", { cx: X(x), cy: Y(y), r: 2.4, fill: color });
        const tt = svg("title");
        tt.textContent = `${se.name}: step ${x}: ${fmt(y, 4)}`;
        c.append(tt);
        s.append(c);
      }
    }
  });
  if (series.length > 1) {
    const legend = el("div", { class: "legend" });
    series.forEach((se, i) => legend.append(el("span", {}, el("i", { style: `background:${se.color || PALETTE[i % PALETTE.length]}` }), se.name)));
    box.append(legend);
  }
  return box;
}

function runCurves(records) {
  return CURVES.map((c) => {
    const series = c.keys.map((k, i) => ({
      name: (c.labels || c.keys)[i],
      points: records.filter((r) => k in r).map((r) => [r.step, r[k]]),
    }));
    const why = c.eval ? "no held-out evaluation logged (trainer.eval_every=0?)" : "no step logged yet";
    return chart(c.title, series, { empty: why, zero: c.keys.length > 1, unit: c.unit });
  });
}

async function loadCurves() {
  const box = $("curves");
  if (state.info.kind === "bench") {
    const keys = CURVES.filter((c) => c.keys.length === 1).map((c) => c.keys[0]);
    const res = await api(`/api/bench_curves?${keys.map((k) => "key=" + encodeURIComponent(k)).join("&")}`);
    state.problems.metrics = res.problems || [];
    const charts = CURVES.filter((c) => c.keys.length === 1).map((c) => {
      const byVariant = (res.data || {})[c.keys[0]] || {};
      const series = Object.entries(byVariant).map(([v, cur]) => ({
        name: `${v} (${cur.seeds} seed${cur.seeds === 1 ? "" : "s"})`,
        points: cur.steps.map((st, j) => [st, cur.mean[j]]),
        band: cur.steps.map((st, j) => [st, cur.lo[j], cur.hi[j]]),
      }));
      return chart(c.title, series, { unit: c.unit });
    });
    box.replaceChildren(el("div", { class: "muted note", text: "each variant: the mean over its seeds, the band from the lowest to the highest seed" }), ...charts);
  } else {
    const res = await api(`/api/metrics?${q({ run: state.run })}`);
    state.problems.metrics = res.problems || [];
    box.replaceChildren(...runCurves(res.data || []));
  }
  showProblems();
}

// ---------------------------------------------------------------- steps and groups
async function loadSteps(keep) {
  const res = await api(`/api/steps?${q({ run: state.run })}`);
  state.problems.steps = res.problems || [];
  const steps = res.data || [];
  const sel = $("step");
  const before = sel.value;
  state.steps = steps;
  sel.replaceChildren(...steps.map((s, i) =>
    el("option", { value: i, text: `${s.split === "eval" ? "eval after" : "train"} step ${s.step}` })));
  sel.disabled = steps.length === 0;
  if (keep && before !== "" && steps[before]) sel.value = before;
  else if (steps.length) sel.value = String(steps.findIndex((s) => s.split === "train") >= 0
    ? steps.map((s) => s.split).lastIndexOf("train") : steps.length - 1);
  showProblems();
  if (!steps.length) {
    $("groups").replaceChildren(el("div", { class: "empty", text: state.problems.steps[0] || "no saved rollouts" }));
    $("count").textContent = "";
    $("more").hidden = true;
  }
  return steps.length > 0;
}

async function loadGroups(append) {
  const s = state.steps[Number($("step").value)];
  if (!s) return;
  if (!append) { state.groups = []; state.offset = 0; }
  const res = await api(`/api/groups?${q({ run: state.run, split: s.split, step: s.step, offset: state.offset, limit: PAGE })}`);
  state.problems.groups = res.problems || [];
  const data = res.data || { groups: [], total: 0 };
  state.groups = state.groups.concat(data.groups);
  state.total = data.total;
  state.offset = state.groups.length;
  $("more").hidden = state.offset >= state.total;
  fillFilterOptions();
  render();
  showProblems();
}

function trajErrorKinds(t) {
  const kinds = new Set();
  for (const c of t.calls || []) if (c.ok === false) kinds.add(c.tool === "invalid" ? "malformed call" : (c.kind || "error"));
  for (const byKind of Object.values(t.tool_errors || {})) for (const k of Object.keys(byKind)) kinds.add(k);
  return kinds;
}

function fillFilterOptions() {
  const kinds = new Set(), errs = new Set();
  for (const g of state.groups) {
    kinds.add(g.task.kind);
    for (const t of g.trajectories) trajErrorKinds(t).forEach((k) => errs.add(k));
  }
  for (const [id, vals] of [["f-kind", kinds], ["f-err", errs]]) {
    const sel = $(id), cur = sel.value;
    sel.replaceChildren(sel.options[0], ...[...vals].sort().map((v) => el("option", { value: v, text: v })));
    sel.value = [...vals].includes(cur) ? cur : "";
  }
}

function matches(g, t) {
  const kind = $("f-kind").value, rew = $("f-reward").value, err = $("f-err").value;
  const text = $("f-text").value.trim().toLowerCase();
  if (kind && g.task.kind !== kind) return false;
  if (rew === "correct" && !t.correct) return false;
  if (rew === "wrong" && t.correct) return false;
  if (rew === "pos" && !(t.reward > 0)) return false;
  if (rew === "nonpos" && t.reward > 0) return false;
  if ($("f-failed").checked && !t.failed) return false;
  if (err && !trajErrorKinds(t).has(err)) return false;
  if (text) {
    const hay = (g.task.question + "\n" + t.segments.map((s) => s.text).join("")).toLowerCase();
    if (!hay.includes(text)) return false;
  }
  return true;
}

function render() {
  const box = $("groups");
  let shown = 0, all = 0;
  const cards = [];
  for (const g of state.groups) {
    const keep = g.trajectories.map((t) => matches(g, t));
    all += keep.length;
    const n = keep.filter(Boolean).length;
    shown += n;
    if (n) cards.push(groupCard(g, keep));
  }
  const s = state.steps[Number($("step").value)];
  $("count").textContent = `${shown} of ${all} trajectories shown, in ${cards.length} of ${state.groups.length} groups` +
    (state.total > state.groups.length ? ` (${state.total} groups recorded: more below)` : "") +
    (s ? ` · ${s.split} step ${s.step}` : "");
  box.replaceChildren(...(cards.length ? cards : [el("div", { class: "empty", text: "no trajectory matches the filters" })]));
}

function rewardClass(t) {  // green: correct; amber: not correct, not penalized; red: penalized (reward < 0)
  return t.correct ? "good" : t.reward >= 0 ? "mid" : "bad";
}

function label(t, i) {
  return (t.tree && t.tree.path) || `#${i}`;
}

function groupCard(g, keep) {
  const rewards = g.trajectories.map((t) => t.reward);
  const mean = rewards.reduce((a, b) => a + b, 0) / Math.max(rewards.length, 1);
  const head = el("div", { class: "group-head" },
    el("span", { class: "kind", text: g.task.kind }),
    el("b", { text: g.task.question }),
    el("span", { class: "muted", text: ` answer: ${g.task.ground_truth} · ${g.trajectories.length} trajectories · mean reward ${fmt(mean)}` +
      (g.info.branch_points !== undefined ? ` · ${g.info.branch_points} branch points` : "") }));
  if (state.info.kind === "bench") {
    head.append(el("button", { class: "small", text: "this task under each variant", onclick: () => compareTask(g.task) }));
  }
  const card = el("div", { class: "group" }, head);
  if (g.trajectories.some((t) => t.parent || (t.tree && t.tree.probes))) card.append(treeView(g, keep));
  const list = el("div", { class: "trajs" });
  g.trajectories.forEach((t, i) => { if (keep[i]) list.append(trajView(g, t, i)); });
  card.append(list);
  return card;
}

// ---------------------------------------------------------------- a trajectory's text
const SCALES = {
  entropy: ["0", "rgba(234,88,12,0), rgba(234,88,12,1)", "≥ 2.5 nats"],
  logprob: ["0", "rgba(147,51,234,0), rgba(147,51,234,1)", "≤ −5"],
  adv: ["−2", "rgba(220,38,38,1), rgba(220,38,38,0), rgba(22,163,74,0), rgba(22,163,74,1)", "+2"],
};
function showScale() {
  const sc = SCALES[$("colour").value];
  $("scale").replaceChildren(...(sc ? [sc[0], el("i", { style: `background: linear-gradient(90deg, ${sc[1]})` }), sc[2]] : []));
}

function colourFor(mode, seg, j) {
  let v;
  if (mode === "entropy") { v = seg.entropies[j]; if (v === null) return ""; return `rgba(234,88,12,${Math.min(1, v / 2.5).toFixed(2)})`; }
  if (mode === "logprob") { v = seg.logprobs[j]; if (v === null) return "rgba(147,51,234,1)"; return `rgba(147,51,234,${Math.min(1, -v / 5).toFixed(2)})`; }
  if (mode === "adv" && seg.adv) {
    v = seg.adv[j]; if (v === null) return "";
    const a = Math.min(1, Math.abs(v) / 2).toFixed(2);
    return v >= 0 ? `rgba(22,163,74,${a})` : `rgba(220,38,38,${a})`;
  }
  return "";
}

function segmentsView(g, t, fromToken = 0, upto = Infinity) {
  const mode = $("colour").value;
  const out = el("div", { class: "text" });
  const calls = new Map((t.calls || []).map((c) => [c.segment, c]));
  let pos = 0;
  t.segments.forEach((seg, si) => {
    const start = pos;
    pos += seg.ids.length;
    if (pos <= fromToken || start >= upto) return;
    if (seg.source === "prompt") {
      out.append(el("details", { class: "seg prompt" }, el("summary", { text: `prompt (${seg.ids.length} tokens)` }), el("pre", { text: seg.text })));
    } else if (seg.source === "tool") {
      const c = calls.get(si) || {};
      const status = c.ok === false ? (c.tool === "invalid" ? "malformed call" : `error: ${c.kind || "error"}`) : "ok";
      out.append(el("details", { class: `seg tool ${c.ok === false ? "bad" : ""}` },
        el("summary", { text: `${c.tool && c.tool !== "invalid" ? c.tool : "env"} result · ${status} · ${seg.ids.length} tokens` }),
        el("pre", { text: seg.text })));
    } else {
      const span = el("span", { class: "seg policy" });
      const pieces = seg.pieces || [seg.text];
      pieces.forEach((p, j) => {
        const tokIdx = start + j;
        if (tokIdx < fromToken || tokIdx >= upto) return;
        const tok = el("span", { class: "tok", text: p });
        const c = mode && seg.pieces ? colourFor(mode, seg, j) : "";
        if (c) tok.style.background = c;
        if (seg.pieces) {
          const parts = [`token ${tokIdx}`, `logprob ${fmt(seg.logprobs[j], 3)}`, `entropy ${fmt(seg.entropies[j], 3)}`];
          if (seg.adv) parts.push(`advantage ${fmt(seg.adv[j], 3)}`);
          if (seg.mask) parts.push(seg.mask[j] ? "trained" : "masked");
          if (seg.versions) parts.push(`weights v${seg.versions[j]}`);
          tok.title = parts.join(" · ");
        }
        span.append(tok);
      });
      out.append(span);
    }
  });
  return out;
}

function trajView(g, t, i) {
  const tags = [
    el("b", { text: label(t, i) }),
    el("span", { class: `pill ${rewardClass(t)}`, text: `reward ${fmt(t.reward)}` }),
  ];
  if (t.advantage !== null && t.advantage !== undefined) tags.push(el("span", { class: "pill", text: `advantage ${fmt(t.advantage)}` }));
  tags.push(el("span", { class: "muted", text: `${t.finish_reason} · ${Object.entries(t.tool_calls).map(([k, v]) => `${k}×${v}`).join(" ") || "no tool call"}` }));
  if (t.failed) tags.push(el("span", { class: "pill bad", text: `failed: ${t.error || ""}` }));
  for (const k of trajErrorKinds(t)) tags.push(el("span", { class: "pill warn", text: k }));
  if (t.parent) tags.push(el("span", { class: "muted", text: `branched at token ${t.branch_token}` }));
  const d = el("details", { class: "traj", "data-uid": t.uid }, el("summary", {}, ...tags));
  d.addEventListener("toggle", () => { if (d.open && d.children.length === 1) d.append(segmentsView(g, t)); }, { once: false });
  return d;
}

// ---------------------------------------------------------------- ARPO trees
function treeView(g, keep) {
  const ts = g.trajectories;
  const byUid = new Map(ts.map((t, i) => [t.uid, i]));
  const children = new Map(ts.map((t) => [t.uid, []]));
  const roots = [];
  ts.forEach((t, i) => { if (t.parent && byUid.has(t.parent)) children.get(t.parent).push(i); else roots.push(i); });
  const order = [];  // depth-first: a branch's row right under its parent's
  const visit = (i) => { order.push(i); children.get(ts[i].uid).sort((a, b) => (ts[a].branch_token || 0) - (ts[b].branch_token || 0)).forEach(visit); };
  roots.forEach(visit);
  const len = (t) => t.segments.reduce((n, s) => n + s.ids.length, 0);
  const maxLen = Math.max(1, ...ts.map(len));
  const promptLen = ts.length ? ts[0].segments.filter((s) => s.source === "prompt").reduce((n, s) => n + s.ids.length, 0) : 0;
  const rowH = 22, L = 40, R = 210, T = 14, W = 880;
  const H = T + order.length * rowH + 10;
  const X = (tok) => L + 18 + (Math.max(0, tok - promptLen) / Math.max(1, maxLen - promptLen)) * (W - L - R - 18);
  const row = new Map(order.map((i, r) => [i, T + r * rowH + rowH / 2]));
  const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", class: "tree", role: "img", "aria-label": "rollout tree" });
  const rootY = T + (order.length * rowH) / 2;
  const node = (cls, cx, cy, r, title, onclick, kind) => {
    const c = svg("circle", { cx, cy, r, class: `node ${cls}`, "data-kind": kind });
    const tt = svg("title"); tt.textContent = title; c.append(tt);
    c.addEventListener("click", (e) => { e.stopPropagation(); onclick(); });
    s.append(c);
    return c;
  };
  for (const i of order) {
    const t = ts[i], y = row.get(i);
    const dim = keep[i] ? "" : " dim";
    const pi = t.parent ? byUid.get(t.parent) : undefined;
    const x0 = pi === undefined ? L + 6 : X(t.branch_token);
    const py = pi === undefined ? rootY : row.get(pi);
    s.append(svg("path", { d: `M${x0},${py} L${x0},${y} L${X(len(t))},${y}`, class: `edge${dim}` + (t.tree && t.tree.role ? ` ${t.tree.role}` : "") }));
    // the tool results along the path (small ticks): where a branch could start
    let pos = 0;
    for (const seg of t.segments) {
      if (seg.source === "tool" && pos + seg.ids.length > (t.branch_token || 0)) s.append(svg("rect", { x: X(pos), y: y - 3, width: Math.max(2, X(pos + seg.ids.length) - X(pos)), height: 6, class: "toolmark" + dim }));
      pos += seg.ids.length;
    }
    const leaf = node(`leaf ${rewardClass(t)}${dim}`, X(len(t)), y, 6,
      `${label(t, i)}: reward ${fmt(t.reward)}, advantage ${fmt(t.advantage)}`, () => showTraj(g, t, i), "leaf");
    leaf.setAttribute("data-uid", t.uid);
    const txt = svg("text", { x: X(len(t)) + 10, y: y + 4, class: "leaf-label" + dim });
    txt.textContent = `${label(t, i)}  r=${fmt(t.reward, 2)}  A=${fmt(t.advantage, 2)}`;
    s.append(txt);
  }
  for (const i of order) {  // branch points over the edges
    const t = ts[i];
    for (const p of (t.tree && t.tree.probes) || []) {
      const y = row.get(i), x = X(p.token);
      const kids = children.get(t.uid).filter((c) => ts[c].branch_token === p.token);
      const title = `${p.forks ? "branch point" : "probe, no branch"} at token ${p.token}: H_t ${fmt(p.h_t)}, H_initial ${fmt(p.h_initial)}, ΔH ${fmt(p.delta_h)}, ${p.forks} fork(s)`;
      const bn = node(p.forks ? "branch" : "probe", x, y, p.forks ? 7 : 4, title, () => showBranch(g, t, i, p, kids), p.forks ? "branch" : "probe");
      bn.setAttribute("data-uid", t.uid);
      bn.setAttribute("data-token", p.token);
      if (p.forks) {
        const lbl = svg("text", { x: x + 2, y: y - 9, class: "branch-label", "text-anchor": "middle" });
        lbl.textContent = `ΔH ${fmt(p.delta_h, 2)}`;
        s.append(lbl);
      }
    }
  }
  node("root", L, rootY, 9, `task ${g.task.id}: the prompt`, () => showRoot(g), "root");
  const legend = el("div", { class: "tree-legend muted", text: "black: the root (the prompt) · purple: branch points, with ΔH (the entropy rise after a tool result) · pale: probes that did not branch · blue bars: tool results · end dots: leaves, coloured by reward (r) with the advantage (A). Click a node to read its text." });
  return el("div", { class: "tree-box" }, s, legend);
}

function openPanel(title, ...body) {
  $("panel-title").textContent = title;
  $("panel-body").replaceChildren(...body);
  $("panel").hidden = false;
}
function showRoot(g) {
  const t = g.trajectories[0];
  openPanel(`task ${g.task.id} (${g.task.kind})`, el("p", { text: `answer: ${g.task.ground_truth}` }),
    el("pre", { class: "node-text", text: t ? t.segments.filter((s) => s.source === "prompt").map((s) => s.text).join("") : g.task.question }));
}
function showTraj(g, t, i) {
  const info = el("p", { class: "muted", text: `reward ${fmt(t.reward)} · advantage ${fmt(t.advantage)} · ${t.finish_reason}` +
    (t.reward_parts ? ` · ${Object.entries(t.reward_parts).map(([k, v]) => `${k}: ${typeof v === "number" ? fmt(v) : v}`).join(", ")}` : "") });
  const start = t.branch_token || 0;
  openPanel(`leaf ${label(t, i)}`, info,
    el("p", { class: "muted", text: t.parent ? `its own tokens, from the branch point (token ${start}) on:` : "the whole trajectory (prompt folded):" }),
    segmentsView(g, t, t.parent ? start : 0));
}
function showBranch(g, t, i, p, kids) {
  const rows = [["H_initial (first turn)", p.h_initial], ["H_t (k tokens after the tool result)", p.h_t], ["ΔH (normalized)", p.delta_h],
    ["forks wanted / made", `${p.forks_wanted} / ${p.forks}`], ["branches", kids.map((c) => label(g.trajectories[c], c)).join(", ") || "none"]];
  openPanel(`${p.forks ? "branch point" : "probe"} on ${label(t, i)} at token ${p.token}`,
    el("table", { class: "kv" }, ...rows.map(([k, v]) => el("tr", {}, el("td", { text: k }), el("td", { text: typeof v === "number" ? fmt(v, 4) : v })))),
    el("p", { class: "muted", text: "the prefix its branches share, up to the branch point (prompt folded):" }),
    segmentsView(g, t, 0, p.token));
}

// ---------------------------------------------------------------- bench
function benchTable(table) {
  if (!table) return el("div", { class: "empty", text: "no results.csv yet" });
  return el("table", { class: "results" },
    el("thead", {}, el("tr", {}, ...table.columns.map((c) => el("th", { text: c })))),
    el("tbody", {}, ...table.rows.map((r) => el("tr", {}, ...r.map((c) => el("td", { text: c }))))));
}
async function compareTask(task) {
  openPanel(`task ${task.id} under each variant`, el("p", { class: "muted", text: "loading…" }));
  const res = await api(`/api/task?${q({ task: task.id })}`);
  const body = [el("p", { text: task.question })];
  for (const [rid, groups] of Object.entries(res.data || {})) {
    const sec = el("div", { class: "cmp" }, el("h3", { text: rid }));
    if (!groups.length) sec.append(el("div", { class: "muted", text: "not recorded in this run" }));
    for (const g of groups) {
      const rs = g.trajectories.map((t) => t.reward);
      sec.append(el("div", { class: "muted", text: `${g.split} step ${g.step}: rewards ${rs.map((r) => fmt(r, 2)).join(" ")}` }));
      g.trajectories.slice(0, 4).forEach((t, i) => sec.append(trajView(g, t, i)));
    }
    body.push(sec);
  }
  for (const p of res.problems || []) body.push(el("div", { class: "problems", text: p }));
  openPanel(`task ${task.id} under each variant`, ...body);
}

// ---------------------------------------------------------------- start
async function refresh() {
  if (!state.info) return;
  const live = Object.values(state.info.runs).some((r) => r.live);
  if (!live) return;
  const res = await api("/api/info");
  if (res.data) state.info = res.data;
  await loadCurves();
  const n = state.steps.length;
  await loadSteps(true);
  if (state.steps.length !== n && state.groups.length === 0) await loadGroups(false);
  $("live").hidden = !Object.values(state.info.runs).some((r) => r.live);
}

async function main() {
  const res = await api("/api/info");
  state.problems.info = res.problems || [];
  showProblems();
  if (!res.data) return;
  state.info = res.data;
  const info = state.info;
  $("where").textContent = info.root;
  const runIds = Object.keys(info.runs);
  state.run = runIds[0] || ".";
  const badges = [el("span", { class: "badge", text: info.kind })];
  if (info.kind === "run") {
    const r = info.runs["."] || {};
    for (const b of [r.algorithm, r.backend && `backend ${r.backend}`, r.steps && `${r.steps} steps`]) if (b) badges.push(el("span", { class: "badge", text: b }));
    badges.push(el("span", { class: `badge ${r.live ? "on" : ""}`, text: r.live ? "live" : r.finished ? "finished" : "stopped" }));
  } else {
    badges.push(el("span", { class: "badge", text: `${Object.keys(info.variants).length} variants, ${runIds.length} runs` }));
    $("bench").hidden = false;
    $("bench-table").replaceChildren(benchTable(info.table));
    $("run-pick").hidden = false;
    $("run").replaceChildren(...runIds.map((r) => el("option", { value: r, text: `${r} (${info.runs[r].algorithm || "?"})` })));
  }
  $("badges").replaceChildren(...badges);
  $("live").hidden = !Object.values(info.runs).some((r) => r.live);
  await loadCurves();
  if (await loadSteps(false)) await loadGroups(false);

  $("run").addEventListener("change", async () => { state.run = $("run").value; if (await loadSteps(false)) await loadGroups(false); });
  $("step").addEventListener("change", () => loadGroups(false));
  $("prev").addEventListener("click", () => { const s = $("step"); if (s.selectedIndex > 0) { s.selectedIndex -= 1; loadGroups(false); } });
  $("next").addEventListener("click", () => { const s = $("step"); if (s.selectedIndex < s.options.length - 1) { s.selectedIndex += 1; loadGroups(false); } });
  $("more").addEventListener("click", () => loadGroups(true));
  for (const id of ["f-kind", "f-reward", "f-failed", "f-err", "colour"]) $(id).addEventListener("change", render);
  $("colour").addEventListener("change", showScale);
  $("f-text").addEventListener("input", render);
  $("panel-close").addEventListener("click", () => { $("panel").hidden = true; });
  setInterval(refresh, REFRESH_S * 1000);
  document.body.dataset.ready = "1";
}

main();
