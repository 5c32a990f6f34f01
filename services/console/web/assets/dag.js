// A layered DAG layout for plan revisions, drawn as SVG: each step sits on
// the layer of its longest dependency chain, layers run top to bottom, and
// two barycentre sweeps order each layer to keep edges short and
// uncrossed. Plans are small (tens of steps), so this is all it takes.

const NS = 'http://www.w3.org/2000/svg';
const W = 180, H = 54, GX = 28, GY = 56, PAD = 16;

function el(tag, attrs, ...children) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

/** layout returns the position of every step of plan: {id: {x, y, layer}}. */
export function layout(plan) {
  const steps = plan.steps || [];
  const byId = new Map(steps.map((s) => [s.id, s]));
  const deps = (s) => (s.dependsOn || []).filter((d) => byId.has(d));
  const layerOf = new Map();
  const depth = (id, seen = new Set()) => {
    if (layerOf.has(id)) return layerOf.get(id);
    if (seen.has(id)) return 0; // a cycle never validates; draw it anyway
    seen.add(id);
    let d = 0;
    for (const p of deps(byId.get(id))) d = Math.max(d, depth(p, seen) + 1);
    layerOf.set(id, d);
    return d;
  };
  steps.forEach((s) => depth(s.id));
  const layers = [];
  for (const s of steps) (layers[layerOf.get(s.id)] ||= []).push(s.id);
  const order = new Map();
  layers.forEach((l) => l.forEach((id, i) => order.set(id, i)));
  for (let pass = 0; pass < 2; pass++) {
    for (let li = 1; li < layers.length; li++) {
      const bc = (id) => {
        const ds = deps(byId.get(id));
        return ds.length ? ds.reduce((a, d) => a + order.get(d), 0) / ds.length : order.get(id);
      };
      const keyed = layers[li].map((id) => [bc(id), order.get(id), id]);
      keyed.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
      layers[li] = keyed.map((k) => k[2]);
      layers[li].forEach((id, i) => order.set(id, i));
    }
  }
  const widest = Math.max(1, ...layers.map((l) => l.length));
  const width = widest * W + (widest - 1) * GX + 2 * PAD;
  const pos = {};
  layers.forEach((l, li) => {
    const rowWidth = l.length * W + (l.length - 1) * GX;
    const x0 = (width - rowWidth) / 2;
    l.forEach((id, i) => { pos[id] = { x: x0 + i * (W + GX), y: PAD + li * (H + GY), layer: li }; });
  });
  return { pos, width, height: 2 * PAD + layers.length * H + Math.max(0, layers.length - 1) * GY };
}

function clip(s, n) { return s.length > n ? s.slice(0, n - 1) + '…' : s; }

/**
 * renderDag draws plan; statusOf(stepId) gives the CSS status name of each
 * node, lineageOf(stepId) "added", "changed" or "" for replans. onSelect is
 * called with a step id when a node is clicked or activated by keyboard.
 */
export function renderDag(plan, statusOf, lineageOf, onSelect) {
  const { pos, width, height } = layout(plan);
  const uid = 'a' + Math.random().toString(36).slice(2, 8);
  const svg = el('svg', { class: 'dag', viewBox: `0 0 ${width} ${height}`, width, height, role: 'group',
    'aria-label': `Plan revision ${plan.revision || 1}: ${(plan.steps || []).length} steps` });
  svg.append(el('defs', {}, el('marker', { id: uid, viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' },
    el('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrow' }))));
  const edges = el('g', { 'aria-hidden': 'true' });
  for (const s of plan.steps || []) {
    for (const d of s.dependsOn || []) {
      if (!pos[d]) continue;
      const a = pos[d], b = pos[s.id];
      const x1 = a.x + W / 2, y1 = a.y + H, x2 = b.x + W / 2, y2 = b.y - 2;
      const my = (y1 + y2) / 2;
      edges.append(el('path', { class: 'edge', d: `M${x1},${y1} C${x1},${my} ${x2},${my} ${x2},${y2}`, 'marker-end': `url(#${uid})`,
        'data-from': d, 'data-to': s.id }));
    }
  }
  svg.append(edges);
  for (const s of plan.steps || []) {
    const p = pos[s.id];
    const status = statusOf(s.id);
    const lineage = lineageOf(s.id);
    const deps = (s.dependsOn || []).length ? `, after ${s.dependsOn.join(', ')}` : '';
    // The accessible name is the visible text (step, tool, status);
    // dependencies and lineage are its description.
    const g = el('g', { class: `node ${status}${lineage ? ' lineage-' + lineage : ''}`, transform: `translate(${p.x},${p.y})`,
      tabindex: '0', role: 'button', 'data-step-id': s.id, 'data-status': status });
    g.append(el('desc', {}, `Step ${s.id}${lineage ? ', ' + lineage + ' in this revision' : ''}${deps || ', no dependencies'}. Enter shows its details.`));
    g.append(el('rect', { width: W, height: H, rx: 8, ry: 8 }));
    g.append(el('text', { x: 10, y: 21, class: 'id' }, clip(s.id, 22)));
    g.append(el('text', { x: 10, y: 40 }, clip(`${s.tool} · ${status.replace(/-/g, ' ')}`, 27)));
    const activate = () => onSelect && onSelect(s.id);
    g.addEventListener('click', activate);
    // Activation on keyup, as buttons do for Space: focus then moves to the
    // step's details only after the whole key press, which would otherwise
    // toggle them again.
    g.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') e.preventDefault(); });
    g.addEventListener('keyup', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); activate(); } });
    svg.append(g);
  }
  return svg;
}

/** setStatuses updates node classes in place (no relayout, no shift). */
export function setStatuses(svg, statusOf) {
  for (const g of svg.querySelectorAll('g.node')) {
    const id = g.getAttribute('data-step-id');
    const status = statusOf(id);
    if (g.getAttribute('data-status') === status) continue;
    const old = g.getAttribute('data-status');
    g.classList.replace(old, status);
    g.setAttribute('data-status', status);
    const t = g.querySelectorAll('text')[1];
    t.textContent = t.textContent.replace(old.replace(/-/g, ' '), status.replace(/-/g, ' '));
  }
}

/**
 * setSelected marks the node of step id as the selected one (the step the
 * run page's reset and fork buttons act on); "" selects none.
 */
export function setSelected(svg, id) {
  for (const g of svg.querySelectorAll('g.node')) {
    const on = g.getAttribute('data-step-id') === id;
    g.classList.toggle('selected', on);
    if (on) g.setAttribute('data-selected', 'true'); else g.removeAttribute('data-selected');
  }
}
