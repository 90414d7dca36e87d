// prime-network dashboard: polls /v1/dashboard every 2 s and redraws tables and inline-SVG charts.
// Plain JavaScript, no dependencies. Text from the ledger (node ids, reasons) and from relays
// (their announced URLs) is only ever set as textContent, never parsed as HTML.
"use strict";

const POLL_INTERVAL_MS = 2000;
const SVG_NS = "http://www.w3.org/2000/svg";
const CHART = { width: 600, height: 240, left: 52, right: 12, top: 12, bottom: 28 };
const MOVING_MEAN_WINDOW = 10;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function svgEl(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

function setText(id, value) {
  document.getElementById(id).textContent = value;
}

function fmt(value, digits) {
  if (value === null || value === undefined || Number.isNaN(value)) return "-";
  return Number(value).toFixed(digits);
}

function ago(at, now) {
  const s = Math.max(0, now - at);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

// Seconds as 1h02m, 3m05s or 42s (what `prime-coordinator status` prints).
function duration(seconds) {
  const whole = Math.round(seconds);
  const [h, m, sec] = [Math.floor(whole / 3600), Math.floor((whole % 3600) / 60), whole % 60];
  const pad = (n) => String(n).padStart(2, "0");
  if (h) return `${h}h${pad(m)}m`;
  return m ? `${m}m${pad(sec)}s` : `${sec}s`;
}

// The time left at the newest steps' pace, as `prime-coordinator status` says it.
function eta(s) {
  if (!s.num_train_steps) return "-";
  if (s.run_ended) return "done";
  if (s.step_s === null || s.step_s === undefined) return "-";
  return duration((s.num_train_steps - s.num_train_steps_done) * s.step_s);
}

function clock(at) {
  return new Date(at * 1000).toLocaleTimeString([], { hour12: false });
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function shortId(id) {
  return id && id.length > 14 ? `${id.slice(0, 6)}...${id.slice(-6)}` : id || "-";
}

function fillTable(id, rows, numColumns, emptyText) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...rows);
  if (!rows.length) body.append(el("tr", {}, el("td", { class: "empty", colspan: numColumns }, emptyText)));
}

function nodeState(node) {
  if (node.banned) return `banned: ${node.ban_reason || ""}`;
  return node.live ? "live" : "not live";
}

function renderSummary(data) {
  const s = data.status;
  setText("run-name", s.run_name);
  setText("stat-policy", `v${s.current_policy_version}`);
  setText("stat-async", s.async_level);
  setText("stat-workers", s.num_workers_live);
  setText("stat-validators", s.num_validators_live);
  const tokens = data.nodes.filter((n) => n.live && n.role === "worker").reduce((sum, n) => sum + n.tokens_per_s, 0);
  setText("stat-tokens", fmt(tokens, 1));
  setText("stat-accepted", s.num_submissions_accepted);
  setText("stat-rejected", s.num_submissions_rejected);
  setText("stat-pending", s.num_submissions_pending);
  setText("stat-environment-errors", s.num_submissions_environment_error);
  setText("stat-expired", s.num_submissions_expired);
  setText("stat-tasks", s.num_tasks_open);
  const audit = data.audit;
  if (audit) {
    const share = `${(100 * audit.lowest_share).toFixed(1)}%`;
    setText("stat-audit", audit.adaptive ? `by record, down to ${share}` : `${share} of each`);
    setText("stat-cheat-bound", `${(100 * audit.cheated_fraction_bound).toFixed(2)}%`);
  }
  const training = data.training;
  setText("stat-step", training && training.current_step !== null ? training.current_step : "-");
  setText("stat-steps-done", training ? training.num_steps_done : "-");
  setText("stat-step-time", s.step_s === null || s.step_s === undefined ? "-" : `${fmt(s.step_s, 1)} s`);
  setText("stat-eta", eta(s));
  const relays = data.relays || [];
  setText("stat-relays", relays.length ? `${relays.filter((r) => r.reachable).length} of ${relays.length}` : "-");
}

function renderWorkers(data) {
  const now = data.generated_at;
  const rows = data.nodes.filter((n) => n.role === "worker").map((n) => el(
    "tr", { "data-node-id": n.node_id, class: n.live ? "live" : "stale" },
    el("td", { class: "id" }, n.node_id),
    el("td", {}, n.engine || "-"),
    el("td", {}, n.policy_version === null ? "-" : `v${n.policy_version}`),
    el("td", {}, n.versions_held.map((v) => `v${v}`).join(" ") || "-"),
    el("td", {}, fmt(n.tokens_per_s, 1)),
    el("td", { class: "good" }, n.num_accepted),
    el("td", { class: n.num_rejected ? "bad" : "" }, n.num_rejected),
    el("td", { class: n.credit_lost_samples ? "bad" : "", title: n.credit_lost_samples ? `lost ${n.credit_lost_samples} to caught cheating` : "" }, n.credit_samples),
    el("td", { title: clock(n.last_seen) }, ago(n.last_seen, now)),
    el("td", { class: n.banned ? "bad" : "" }, nodeState(n)),
  ));
  fillTable("workers", rows, 9, "no worker has registered yet");
}

function renderValidators(data) {
  const now = data.generated_at;
  const rows = data.nodes.filter((n) => n.role === "validator").map((n) => el(
    "tr", { "data-node-id": n.node_id, class: n.live ? "live" : "stale" },
    el("td", { class: "id" }, n.node_id),
    el("td", {}, n.versions_held.map((v) => `v${v}`).join(" ") || "-"),
    el("td", { class: n.flagged ? "bad" : "" }, `${n.num_votes_agreed} / ${n.num_votes_outvoted}${n.flagged ? " (flagged)" : ""}`),
    el("td", { title: clock(n.last_seen) }, ago(n.last_seen, now)),
    el("td", {}, nodeState(n)),
  ));
  fillTable("validators", rows, 5, "no validator has registered yet");
}

function holdersBar(count, total) {
  const width = 80;
  const svg = svgEl("svg", { width, height: 8, class: "holders" });
  svg.append(svgEl("rect", { width, height: 8, fill: "#dde1e7", rx: 2 }));
  svg.append(svgEl("rect", { width: total ? (width * count) / total : 0, height: 8, fill: "#2f6fdb", rx: 2 }));
  return el("span", {}, svg, ` ${count} of ${total}`);
}

function renderVersions(data) {
  const now = data.generated_at;
  const liveNodes = data.nodes.filter((n) => n.live).length;
  const reachableRelays = (data.relays || []).filter((r) => r.reachable).length;
  const rows = data.versions.map((v) => el(
    "tr", { "data-version": v.version },
    el("td", {}, `v${v.version}`),
    el("td", {}, v.published_at === null ? "-" : ago(v.published_at, now)),
    el("td", {}, bytes(v.total_size_bytes)),
    el("td", { class: "version-kind" }, v.kind === "patch"
      ? `patch of v${v.base_version} (${bytes(v.checkpoint_bytes)} checkpoint)`
      : (v.kind || "-")),
    el("td", {}, holdersBar(v.num_live_holders, liveNodes)),
    el("td", { class: "relay-holders" }, holdersBar(v.num_relays, reachableRelays)),
    el("td", { class: "good" }, v.num_accepted),
    el("td", { class: v.num_rejected ? "bad" : "" }, v.num_rejected),
    el("td", {}, fmt(v.mean_reward, 3)),
  ));
  fillTable("versions", rows, 9, "no policy version published yet");
}

function relayState(r) {
  if (r.checked_at === null) return "not asked yet";
  return r.reachable ? "answering" : `unreachable: ${r.error || "?"}`;
}

function renderRelays(data) {
  const now = data.generated_at;
  const versions = (list) => list.map((v) => `v${v}`).join(" ") || "-";
  const rows = (data.relays || []).map((r) => el(
    "tr", { "data-relay-url": r.url, class: r.reachable ? "live" : "stale" },
    el("td", { class: "id" }, r.url),
    el("td", {}, versions(r.versions_held)),
    el("td", {}, versions(r.versions_mirroring)),
    el("td", r.answered_at === null ? {} : { title: clock(r.answered_at) },
      r.answered_at === null ? "never" : ago(r.answered_at, now)),
    el("td", { class: r.reachable ? "good" : "bad" }, relayState(r)),
  ));
  fillTable("relays", rows, 5, "no relay has announced itself on gossip");
}

function renderVerdicts(data) {
  const now = data.generated_at;
  const rows = data.verdicts.map((v) => el(
    "tr", { "data-submission-id": v.submission_id },
    el("td", { title: clock(v.at) }, ago(v.at, now)),
    el("td", { class: "id" }, v.submission_id),
    el("td", { class: "id", title: v.worker_id }, shortId(v.worker_id)),
    el("td", {}, v.policy_version === null ? "-" : `v${v.policy_version}`),
    el("td", {}, v.engine || "-"),
    el("td", { class: v.accepted ? "good" : "bad" }, v.accepted ? "accepted" : "rejected"),
    el("td", {}, v.num_rollouts),
    el("td", {}, fmt(v.mean_reward, 3)),
    el("td", { class: "reasons" }, v.reasons.join("; ") || "-"),
  ));
  fillTable("verdicts", rows, 9, "no verdict yet");
}

// ---- charts -------------------------------------------------------------------------------------

function niceTicks(lo, hi, count) {
  const span = hi - lo || 1;
  const raw = span / count;
  const step = [1, 2, 2.5, 5, 10].map((m) => m * 10 ** Math.floor(Math.log10(raw))).find((s) => s >= raw);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toFixed(10)));
  return ticks;
}

// Draws an empty frame with axes and returns scale functions; null when there is nothing to draw.
// The x axis is time unless xLabel says how to label it; integerX puts its labels on whole numbers (steps).
function frame(svg, xs, ys, yDigits, xLabel = clock, emptyText = "no data yet", integerX = false) {
  svg.replaceChildren();
  if (!xs.length) {
    svg.append(svgEl("text", { x: CHART.width / 2, y: CHART.height / 2, "text-anchor": "middle", class: "no-data" },
      emptyText));
    return null;
  }
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  if (x1 - x0 < 1) { x0 -= 1; x1 += 1; }
  let [y0, y1] = [Math.min(0, ...ys), Math.max(...ys)];
  if (y1 - y0 < 1e-9) { y1 = y0 + 1; }
  const ticks = niceTicks(y0, y1, 4);
  y1 = Math.max(y1, ticks[ticks.length - 1]);
  const w = CHART.width - CHART.left - CHART.right;
  const h = CHART.height - CHART.top - CHART.bottom;
  const sx = (x) => CHART.left + ((x - x0) / (x1 - x0)) * w;
  const sy = (y) => CHART.top + h - ((y - y0) / (y1 - y0)) * h;
  for (const t of ticks) {
    svg.append(svgEl("line", { x1: CHART.left, x2: CHART.left + w, y1: sy(t), y2: sy(t), class: "grid" }));
    svg.append(svgEl("text", { x: CHART.left - 6, y: sy(t) + 4, "text-anchor": "end", class: "tick" },
      t.toFixed(yDigits)));
  }
  const xTicks = integerX
    ? niceTicks(x0, x1, 3).filter((x) => Number.isInteger(x) && x >= x0 && x <= x1)
    : [0, 1, 2, 3].map((i) => x0 + ((x1 - x0) * i) / 3);
  for (const x of xTicks) {
    const edge = (x - x0) / (x1 - x0);
    const anchor = edge < 0.05 ? "start" : edge > 0.95 ? "end" : "middle";  // the outer labels stay inside
    svg.append(svgEl("text", { x: sx(x), y: CHART.height - 8, "text-anchor": anchor, class: "tick" }, xLabel(x)));
  }
  svg.append(svgEl("line", { x1: CHART.left, x2: CHART.left, y1: CHART.top, y2: CHART.top + h, class: "axis" }));
  svg.append(svgEl("line", { x1: CHART.left, x2: CHART.left + w, y1: CHART.top + h, y2: CHART.top + h, class: "axis" }));
  return { sx, sy };
}

function polyline(svg, points, sx, sy, cls) {
  if (points.length < 2) return;
  const d = points.map(([x, y]) => `${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join(" ");
  svg.append(svgEl("polyline", { points: d, class: cls }));
}

function drawRewardChart(data) {
  const svg = document.getElementById("reward-chart");
  const verdicts = data.rewards.filter((v) => v.mean_reward !== null);
  const scale = frame(svg, verdicts.map((v) => v.at), verdicts.map((v) => v.mean_reward), 2);
  if (!scale) return;
  const { sx, sy } = scale;
  let version = null;
  for (const v of verdicts) {  // a dashed mark where verdicts on a new policy version start
    if (v.policy_version !== null && v.policy_version !== version) {
      version = v.policy_version;
      svg.append(svgEl("line", { x1: sx(v.at), x2: sx(v.at), y1: CHART.top, y2: CHART.height - CHART.bottom,
        class: "version-mark" }));
      svg.append(svgEl("text", { x: sx(v.at) + 3, y: CHART.top + 10, class: "version-label" }, `v${version}`));
    }
  }
  const accepted = verdicts.filter((v) => v.accepted);
  const mean = accepted.map((v, i) => {
    const window = accepted.slice(Math.max(0, i - MOVING_MEAN_WINDOW + 1), i + 1);
    return [v.at, window.reduce((sum, w) => sum + w.mean_reward, 0) / window.length];
  });
  polyline(svg, mean, sx, sy, "series-line");
  for (const v of verdicts) {
    const dot = svgEl("circle", { cx: sx(v.at), cy: sy(v.mean_reward), r: 4,
      class: `point ${v.accepted ? "accepted" : "rejected"}`, "data-submission-id": v.submission_id });
    dot.append(svgEl("title", {}, `${v.submission_id} v${v.policy_version ?? "?"}: mean reward ` +
      `${fmt(v.mean_reward, 3)} over ${v.num_rollouts} rollouts (${v.accepted ? "accepted" : "rejected"})`));
    svg.append(dot);
  }
}

// A line over time with a dot per point (data-at: its time, titled with its value).
function drawSeriesChart(id, series, digits, cls, unit) {
  const svg = document.getElementById(id);
  const scale = frame(svg, series.map((p) => p.at), series.map((p) => p.value), digits);
  if (!scale) return;
  polyline(svg, series.map((p) => [p.at, p.value]), scale.sx, scale.sy, cls);
  for (const p of series) {
    const dot = svgEl("circle", { cx: scale.sx(p.at), cy: scale.sy(p.value), r: series.length === 1 ? 3 : 1.5,
      class: "point accepted", "data-at": p.at });
    dot.append(svgEl("title", {}, `${clock(p.at)}: ${fmt(p.value, digits)} ${unit}`));
    svg.append(dot);
  }
}

const stepLabel = (x) => `step ${x}`;

function drawStepChart(data) {
  const svg = document.getElementById("step-chart");
  const steps = data.training ? data.training.steps : [];
  const scale = frame(svg, steps.map((s) => s.step), steps.map((s) => s.reward_mean), 2, stepLabel,
    "no training steps yet", true);
  if (!scale) return;
  polyline(svg, steps.map((s) => [s.step, s.reward_mean]), scale.sx, scale.sy, "series-line");
  for (const s of steps) {
    const dot = svgEl("circle", { cx: scale.sx(s.step), cy: scale.sy(s.reward_mean), r: 4, class: "point accepted",
      "data-step": s.step });
    const named = Object.entries(s.rewards || {}).map(([name, value]) => `${name} ${fmt(value, 3)}`).join(", ");
    dot.append(svgEl("title", {}, `step ${s.step}: mean reward ${fmt(s.reward_mean, 3)}${named ? ` (${named})` : ""} (trained ${clock(s.at)})`));
    svg.append(dot);
  }
}

// Lines over integer steps: each series is [label, cls, [[step, value], ...]]; a dot per point, titled.
function drawStepLines(id, series, digits, emptyText) {
  const svg = document.getElementById(id);
  const points = series.flatMap(([, , pts]) => pts);
  const scale = frame(svg, points.map(([x]) => x), points.map(([, y]) => y), digits, stepLabel, emptyText, true);
  if (!scale) return;
  for (const [label, cls, pts] of series) {
    polyline(svg, pts, scale.sx, scale.sy, `series-line ${cls}`);
    for (const [x, y] of pts) {
      const dot = svgEl("circle", { cx: scale.sx(x), cy: scale.sy(y), r: 3, class: `point ${cls || "accepted"}`, "data-step": x });
      dot.append(svgEl("title", {}, `step ${x}: ${label} ${fmt(y, digits + 1)}`));
      svg.append(dot);
    }
  }
  series.forEach(([label, cls], i) => {  // a legend, top right
    svg.append(svgEl("text", { x: CHART.width - CHART.right, y: CHART.top + 12 + 14 * i, "text-anchor": "end",
      class: `legend ${cls}` }, label));
  });
}

const known = (steps, key) => steps.filter((s) => s[key] !== null && s[key] !== undefined).map((s) => [s.step, s[key]]);
const SERIES_CLASSES = ["", "alt", "c3", "c4", "c5", "c6"];

function drawRolloutCharts(data) {
  const steps = data.training ? data.training.steps : [];
  const evals = data.training ? data.training.evals : [];
  drawStepLines("length-chart", [["batch", "", known(steps, "completion_tokens_mean")],
    ["eval", "alt", known(evals, "completion_tokens_mean")]], 1, "no training steps yet");
  drawStepLines("finish-chart", [["stop", "", known(steps, "stop_fraction")],
    ["truncated", "alt", known(steps, "truncated_fraction")]], 2, "no training steps yet");
  const names = [...new Set(steps.flatMap((s) => Object.keys(s.rewards || {})))].sort();
  drawStepLines("component-chart", names.map((name, i) => [name, SERIES_CLASSES[i % SERIES_CLASSES.length],
    steps.filter((s) => s.rewards && name in s.rewards).map((s) => [s.step, s.rewards[name]])]), 2,
    "no named rewards yet");
  drawStepLines("loss-chart", [["loss", "", known(steps, "loss")], ["grad norm", "alt", known(steps, "grad_norm")]],
    3, "no training steps yet");
  drawStepLines("entropy-chart", [["entropy", "", known(steps, "entropy")]], 3, "no training steps yet");
  drawStepLines("kl-chart", [["mismatch KL", "", known(steps, "mismatch_kl")]], 4, "no training steps yet");
  drawStepLines("checks-chart", [["out of band", "", known(steps, "out_of_band_fraction")],
    ["no signal", "alt", known(steps, "zero_signal_fraction")], ["refused", "c3", known(steps, "breaker_trips")]], 2,
    "no training steps yet");
  drawStepLines("eval-chart", [["accuracy", "", known(evals, "accuracy")],
    ["reward", "alt", known(evals, "reward_mean")], ["stop", "c3", known(evals, "stop_fraction")]], 2,
    "no eval yet (orchestrator.eval_every_steps)");
}

// ---- polling ------------------------------------------------------------------------------------

function render(data) {
  renderSummary(data);
  renderWorkers(data);
  renderValidators(data);
  renderVersions(data);
  renderRelays(data);
  renderVerdicts(data);
  drawRewardChart(data);
  drawSeriesChart("throughput-chart", data.accepted_samples_per_s, 2, "series-line", "samples/s");
  drawSeriesChart("tokens-chart", data.tokens_per_s, 1, "series-line alt", "tokens/s");
  drawStepChart(data);
  drawRolloutCharts(data);
  document.body.dataset.updatedAt = String(data.generated_at);
}

async function poll() {
  const connection = document.getElementById("connection");
  try {
    const response = await fetch("/v1/dashboard", { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    render(data);
    connection.textContent = `updated ${clock(data.generated_at)}`;
    connection.classList.remove("down");
  } catch (error) {
    connection.textContent = `coordinator unreachable (${error.message}); retrying`;
    connection.classList.add("down");
  } finally {
    setTimeout(poll, POLL_INTERVAL_MS);
  }
}

poll();
