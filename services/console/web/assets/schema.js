// A JSON-schema subset validator for tool arguments in the browser: type,
// required, properties, additionalProperties: false, enum, const,
// minimum/maximum, minLength/maxLength, minItems/maxItems and items. The
// supervisor validates against the full schema afterwards; this catches
// the usual slips at the field before a round trip.

import { h } from './ui.js';

function typeOf(v) {
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'array';
  if (typeof v === 'number') return Number.isInteger(v) ? 'integer' : 'number';
  return typeof v; // string, boolean, object
}

function typeOK(want, v) {
  const got = typeOf(v);
  return want === got || (want === 'number' && got === 'integer');
}

/**
 * validate checks value against schema and returns the problems, each
 * {path, message}: path is "args.sql" style ("args" for the whole value).
 */
export function validate(schema, value, path = 'args') {
  const out = [];
  check(schema || {}, value, path, out);
  return out;
}

function check(s, v, path, out) {
  if (!s || typeof s !== 'object') return;
  if (s.type !== undefined) {
    const types = Array.isArray(s.type) ? s.type : [s.type];
    if (!types.some((t) => typeOK(t, v))) {
      out.push({ path, message: `want ${types.join(' or ')}, got ${typeOf(v)}` });
      return;
    }
  }
  if (s.enum && !s.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) {
    out.push({ path, message: `want one of ${s.enum.map((e) => JSON.stringify(e)).join(', ')}` });
  }
  if (s.const !== undefined && JSON.stringify(s.const) !== JSON.stringify(v)) out.push({ path, message: `want ${JSON.stringify(s.const)}` });
  if (typeof v === 'number') {
    if (s.minimum !== undefined && v < s.minimum) out.push({ path, message: `want at least ${s.minimum}` });
    if (s.maximum !== undefined && v > s.maximum) out.push({ path, message: `want at most ${s.maximum}` });
    if (s.exclusiveMinimum !== undefined && typeof s.exclusiveMinimum === 'number' && v <= s.exclusiveMinimum) out.push({ path, message: `want more than ${s.exclusiveMinimum}` });
    if (s.exclusiveMaximum !== undefined && typeof s.exclusiveMaximum === 'number' && v >= s.exclusiveMaximum) out.push({ path, message: `want less than ${s.exclusiveMaximum}` });
  }
  if (typeof v === 'string') {
    const n = [...v].length;
    if (s.minLength !== undefined && n < s.minLength) out.push({ path, message: `want at least ${s.minLength} characters` });
    if (s.maxLength !== undefined && n > s.maxLength) out.push({ path, message: `want at most ${s.maxLength} characters` });
  }
  if (Array.isArray(v)) {
    if (s.minItems !== undefined && v.length < s.minItems) out.push({ path, message: `want at least ${s.minItems} items` });
    if (s.maxItems !== undefined && v.length > s.maxItems) out.push({ path, message: `want at most ${s.maxItems} items` });
    if (s.items && typeof s.items === 'object' && !Array.isArray(s.items)) v.forEach((x, i) => check(s.items, x, `${path}[${i}]`, out));
  }
  if (typeOf(v) === 'object') {
    for (const r of s.required || []) if (!(r in v)) out.push({ path: `${path}.${r}`, message: 'required' });
    const props = s.properties || {};
    for (const [k, x] of Object.entries(v)) {
      if (props[k]) check(props[k], x, `${path}.${k}`, out);
      else if (s.additionalProperties === false) out.push({ path: `${path}.${k}`, message: 'not an argument of this tool' });
      else if (s.additionalProperties && typeof s.additionalProperties === 'object') check(s.additionalProperties, x, `${path}.${k}`, out);
    }
  }
}

// ---- answer forms ----------------------------------------------------------
// answerForm builds the form of a human.input step's question from the JSON
// schema of its answer (docs/human-input.md): a choice list for an enum
// (the step's choices), a text, number or checkbox field for a string,
// number, integer or boolean, one such field per property for an object of
// flat properties, and a JSON text area for anything else. The supervisor
// checks the answer against the full schema; a wrong one comes back with
// the schema's message, shown under the form, and the gate stays open.


const flatTypes = new Set(['string', 'number', 'integer', 'boolean']);

function flat(s) {
  return !!s && typeof s === 'object' && (Array.isArray(s.enum) || flatTypes.has(s.type));
}

/**
 * answerForm returns {el, value, focus}: el the fields, value() the answer
 * the fields hold (or throws an Error naming the field when one cannot be
 * read, e.g. JSON that does not parse), focus() the first field.
 */
export function answerForm(schema, idPrefix) {
  const s = schema && typeof schema === 'object' ? schema : { type: 'string' };
  if (s.type === 'object' && s.properties && Object.values(s.properties).every(flat)) {
    const required = new Set(s.required || []);
    const fields = Object.entries(s.properties).map(([name, p]) => ({ name, ...field(p, `${idPrefix}-${name}`, name + (required.has(name) ? '' : ' (optional)'), `answer.${name}`) }));
    return {
      el: h('fieldset', { class: 'answer-form' }, h('legend', {}, 'Answer'), fields.map((f) => f.el)),
      value: () => {
        const out = {};
        for (const f of fields) {
          const v = f.value();
          if (v !== undefined) out[f.name] = v;
        }
        return out;
      },
      focus: () => fields[0]?.focus(),
    };
  }
  const f = field(s, idPrefix, 'Answer', 'answer');
  return { el: h('div', { class: 'answer-form' }, f.el), value: f.value, focus: f.focus };
}

// field is one labelled control for schema s; value() returns its value
// (undefined for an empty optional text).
function field(s, id, label, path) {
  const hint = s.description ? h('small', { class: 'muted' }, ' ', s.description) : '';
  let input;
  let value;
  if (Array.isArray(s.enum)) {
    input = h('select', { id, name: path }, h('option', { value: '' }, '— choose —'),
      s.enum.map((e, i) => h('option', { value: String(i) }, typeof e === 'string' ? e : JSON.stringify(e))));
    value = () => {
      if (input.value === '') throw new Error(`${path}: choose one`);
      return s.enum[Number(input.value)];
    };
  } else if (s.type === 'boolean') {
    input = h('input', { id, name: path, type: 'checkbox' });
    value = () => input.checked;
  } else if (s.type === 'number' || s.type === 'integer') {
    input = h('input', { id, name: path, type: 'text', inputmode: 'decimal' });
    value = () => {
      const t = input.value.trim();
      if (t === '') return undefined;
      const n = Number(t);
      // Not a number: sent as typed, so the schema's message says so.
      return Number.isNaN(n) ? t : n;
    };
  } else if (s.type === 'string') {
    input = h('input', { id, name: path, type: 'text' });
    value = () => input.value;
  } else {
    input = h('textarea', { id, name: path, rows: 5, spellcheck: 'false' });
    value = () => {
      try { return JSON.parse(input.value); } catch (e) { throw new Error(`${path}: not valid JSON (${e.message})`); }
    };
  }
  const el = s.type === 'boolean'
    ? h('p', { class: 'check' }, input, h('label', { for: id }, label), hint)
    : h('div', { class: 'field' }, h('label', { for: id }, label, hint), input);
  return { el, value, focus: () => input.focus() };
}
