
(function(){
const D = JSON.parse(document.getElementById('compare-data').textContent);
const A = D.a, B = D.b, $ = id => document.getElementById(id);
const PHASES = ['generate_sequences', 'tool_calls', 'compute_score'], STATS = ['p50', 'p90', 'p99', 'max'];
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function add(parent, ...children) { for (const c of children) parent.appendChild(c); return parent; }
const f = v => v.toFixed(3);
const d = v => Math.abs(v) < 5e-4 ? '+0.000' : (v > 0 ? '+' : '') + v.toFixed(3);
const dcls = v => v >= 5e-4 ? 'up' : (v <= -5e-4 ? 'down' : '');
function row(cells) {  // cells: [text, class] pairs
  const tr = el('tr');
  for (const [text, cls] of cells) tr.appendChild(el('td', cls || null, text));
  return tr;
}
function headRow(names, left) {
  const tr = el('tr');
  for (const h of names) tr.appendChild(el('th', left && left.includes(h) ? 'l' : null, h));
  return tr;
}
function legend(items) {
  const lg = el('div', 'legend');
  for (const [cls, text] of items) add(lg, add(el('span'), el('i', 'seg ' + cls), document.createTextNode(text)));
  return lg;
}
function bar(parts, max) {  // parts: [class, seconds] stacked
  const b = el('div', 'bar');
  for (const [cls, v] of parts) {
    const s = el('div', 'seg ' + cls);
    s.style.width = (100 * v / max) + '%';
    s.title = cls + ' ' + f(v) + ' s';
    b.appendChild(s);
  }
  return b;
}
const sa = 'step ' + A.step, sb = 'step ' + B.step;
$('title').textContent = sa + ' \u2192 ' + sb + (A.validate ? ' (validation)' : '');
$('source').textContent = 'from ' + (D.source || 'stored spans') + ' \u00b7 ' + sa + ': summary ' + A.summary
  + '; ' + sb + ': summary ' + B.summary;
const cause = $('cause');
cause.className = D.cause.phase ? 'clear' : 'unclear';
add(cause, el('b', null, 'Cause: '), document.createTextNode(D.cause.text));

// step time, split at the median sample when wall times are known
const st = $('steptime'), T = D.step_time, split = A.wall_s > 0 && B.wall_s > 0;
st.appendChild(el('div', null, T.basis + ': ' + f(T.a) + ' s \u2192 ' + f(T.b) + ' s (' + d(T.delta) + ' s)'));
if (split) st.appendChild(legend([['median', 'until the median sample finished'], ['tail', 'median to slowest']]));
const grid = el('div', 'bars'), max = Math.max(T.a, T.b) || 1;
for (const S of [A, B]) {
  const parts = split ? [['median', S.until_median_s], ['tail', S.tail_s]] : [['tail', S.step_s]];
  const text = f(S.step_s) + ' s' + (split ? ' (median ' + f(S.until_median_s) + ', tail ' + f(S.tail_s) + ')' : '');
  add(grid, el('div', null, 'step ' + S.step), bar(parts, max), el('div', null, text));
}
st.appendChild(grid);

// the tails' phase mix, and per tool
const tail = $('tail');
tail.appendChild(legend(PHASES.map(p => [p, p])));
const tg = el('div', 'bars');
const mix = S => PHASES.map(p => [p, S.tail_mix.phases[p] || 0]);
const tmax = Math.max(...[A, B].map(S => mix(S).reduce((t, [, v]) => t + v, 0))) || 1;
for (const S of [A, B]) {
  add(tg, el('div', null, 'step ' + S.step), bar(mix(S), tmax), el('div', null, S.tail_mix.basis));
}
tail.appendChild(tg);
const tools = [...new Set([...Object.keys(A.tail_mix.tools), ...Object.keys(B.tail_mix.tools)])].sort();
const tt = el('table');
tt.id = 'tailtable';
tt.appendChild(headRow(['', sa, sb, 'delta']));
const tailRows = PHASES.map(p => [p, A.tail_mix.phases[p] || 0, B.tail_mix.phases[p] || 0])
  .concat(tools.map(t => ['tool ' + t, A.tail_mix.tools[t] || 0, B.tail_mix.tools[t] || 0]));
for (const [name, va, vb] of tailRows) tt.appendChild(row([[name], [f(va)], [f(vb)], [d(vb - va), dcls(vb - va)]]));
tail.appendChild(tt);

// per phase and per tool, side by side
const stats = $('stats'), h1 = add(el('tr'), el('th', null, ''));
for (const s of ['count', ...STATS]) { const h = el('th', 'group', s); h.colSpan = 3; h1.appendChild(h); }
const h2 = add(el('tr'), el('th', null, 'phase / tool'));
for (let i = 0; i <= STATS.length; i++) for (const t of [sa, sb, 'delta']) h2.appendChild(el('th', null, t));
add(stats.tHead, h1, h2);
for (const r of D.rows) {
  const isCause = r.kind === 'tool' ? r.name === D.cause.tool : (r.name === D.cause.phase && !D.cause.tool);
  const cells = [[r.kind === 'tool' ? 'tool ' + r.name : r.name], [String(r.a.count), 'first'], [String(r.b.count)],
    [(r.delta.count >= 0 ? '+' : '') + r.delta.count]];
  for (const s of STATS) cells.push([f(r.a[s]), 'first'], [f(r.b[s])], [d(r.delta[s]), dcls(r.delta[s])]);
  const tr = row(cells);
  tr.className = r.kind + (isCause ? ' cause' : '');
  tr.dataset.name = r.name;
  stats.tBodies[0].appendChild(tr);
}

// the samples that moved most
const mt = $('moved'), tm = 'moved most', ta = 'trace ' + sa, tb = 'trace ' + sb;
mt.tHead.appendChild(headRow(['sample / rollout', 'total ' + sa, 'total ' + sb, 'delta', tm, ta, tb], [tm, ta, tb]));
function trace(tid, page, sample) {
  const td = el('td', 'l');
  if (!tid) td.textContent = '-';
  else if (D.jaeger || page) {
    const a = el('a', D.jaeger ? 'jaeger-link' : 'trace-link', tid);
    a.setAttribute('href', D.jaeger ? D.jaeger + '/trace/' + encodeURIComponent(tid)
                                    : page + '#trace=' + encodeURIComponent(tid) + '&sample=' + sample);
    a.setAttribute('target', '_blank');
    a.setAttribute('rel', 'noopener noreferrer');
    td.appendChild(a);
  } else td.textContent = tid;
  return td;
}
for (const m of D.moved) {
  const tr = row([[m.sample_index + ' / ' + m.rollout_n], [f(m.total_a)], [f(m.total_b)], [d(m.delta), dcls(m.delta)],
    [m.moved_most, 'l']]);
  const who = m.sample_index + '/' + m.rollout_n;
  add(tr, trace(m.trace_id_a, D.pages.a, who), trace(m.trace_id_b, D.pages.b, who));
  mt.tBodies[0].appendChild(tr);
}
if (!D.moved.length) $('only').textContent = 'No sample rows: matching samples needs the sample spans of both steps.';
else if (D.only_in_a || D.only_in_b)
  $('only').textContent = `Samples in one step only: ${D.only_in_a} in ${sa}, ${D.only_in_b} in ${sb}.`;
for (const n of D.notes) $('notes').appendChild(el('li', null, n));
})();
