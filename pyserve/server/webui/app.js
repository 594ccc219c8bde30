// The chat page: the conversations (store.js) shown and edited, replies streamed from the server (api.js)
// and drawn as they come (views.js, markdown.js), each conversation with its own settings (settings.js).
// One generation runs at a time; Stop aborts its fetch, which closes the connection, and the server aborts
// the engine request and frees its blocks.

import * as api from './api.js';
import * as store from './store.js';
import { chatBody, completionBody, defaults, fromQuery, normalize } from './settings.js';
import { conversationItem, el, emptyHint, fill, messageView, statsText } from './views.js';

const $ = (id) => document.getElementById(id);
const state = {
  convs: [], current: null, models: [],
  job: null,  // the running generation: {controller, conv, msg (a chat reply) or null (completion)}
  editing: false,  // the composer holds the last user message, to be sent in its place
  completion: new Map(),  // conversation id → the last completion's {stats, error, stopped}, shown under it
  painting: false,
};

function boot() {
  state.convs = store.load();
  state.current = state.convs.find((c) => c.id === store.currentId()) || state.convs[0] || null;
  const preset = fromQuery(location.search);
  if (preset) {
    const conv = state.current && store.isEmpty(state.current) ? state.current : addConversation();
    conv.settings = normalize(preset.settings);  // a link opens the same way in every browser
    conv.mode = preset.mode || 'chat';
    history.replaceState(null, '', location.pathname);  // a reload reopens this conversation
  }
  if (!state.current) addConversation();
  persist();
  wire();
  show();
  autosize();
  loadModels();
}

function addConversation(from = state.current) {
  const conv = store.create(from ? from.settings : defaults(), from ? from.mode : 'chat');
  state.convs.unshift(conv);
  state.current = conv;
  return conv;
}

function persist() {
  if (!store.save(state.convs, state.current?.id)) {
    notice('This browser did not store the conversations (is its storage full?).');
  }
}

function notice(text) {
  $('notice').textContent = text;
  $('notice').hidden = !text;
}

// ---- drawing ----

function show() {
  const conv = state.current;
  document.body.classList.toggle('mode-chat', conv.mode === 'chat');
  document.body.classList.toggle('mode-complete', conv.mode === 'complete');
  for (const b of document.querySelectorAll('.modes button')) {
    b.setAttribute('aria-pressed', b.dataset.mode === conv.mode);
  }
  $('chat').hidden = conv.mode !== 'chat';
  $('complete').hidden = conv.mode !== 'complete';
  renderList();
  renderModels();
  renderSummary();
  renderMessages();
  $('document').value = conv.document;
  renderCompletionStatus();
  busy(Boolean(state.job));
}

function renderList() {
  $('conversations').replaceChildren(...state.convs.map((c) => conversationItem(c, c === state.current)));
}

function renderModels() {
  const s = state.current.settings, names = [...state.models];
  if (s.model && !names.includes(s.model)) names.push(s.model);
  $('model').replaceChildren(...names.map((n) => {
    const o = el('option', '', state.models.includes(n) || !state.models.length ? n : `${n} (not served)`);
    o.value = n;
    return o;
  }));
  $('model').value = s.model || names[0] || '';
}

function renderSummary() {
  const s = state.current.settings;
  const parts = ['temperature', 'top_p', 'max_tokens'].filter((k) => s[k] !== null).map((k) => `${k} ${s[k]}`);
  if (Object.keys(s.extra).length) parts.push(`+${Object.keys(s.extra).length}`);
  $('settings-summary').textContent = parts.join(' · ');
}

function places(conv, i) {
  const lastUser = conv.messages.findLastIndex((m) => m.role === 'user');
  return { lastUser: i === lastUser, last: i === conv.messages.length - 1,
    pending: state.job?.msg === conv.messages[i] };
}

function renderMessages() {
  const conv = state.current, box = $('messages');
  box.replaceChildren(...conv.messages.map((m, i) => messageView(m, places(conv, i))));
  if (!conv.messages.length) box.append(emptyHint());
  box.scrollTop = box.scrollHeight;
}

function renderCompletionStatus() {
  const r = state.completion.get(state.current.id), status = $('complete-status');
  status.classList.toggle('error', Boolean(r?.error));
  status.textContent = r ? (r.error ? r.error.text : statsText(r.stats, r.stopped)) : '';
}

/** Draws the running generation's text once per frame, however many chunks came in it. */
function schedulePaint() {
  if (state.painting) return;
  state.painting = true;
  requestAnimationFrame(() => {
    state.painting = false;
    const job = state.job;
    if (!job || job.conv !== state.current) return;
    if (job.msg) {
      const box = $('messages'), follow = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
      fill(box.lastElementChild, job.msg, places(job.conv, job.conv.messages.length - 1));
      if (follow) box.scrollTop = box.scrollHeight;
    } else {
      $('document').value = job.conv.document;
      $('document').scrollTop = $('document').scrollHeight;
    }
  });
}

function busy(on) {
  const here = on && state.job?.conv === state.current;
  $('send').hidden = $('generate').hidden = here;
  $('stop').hidden = $('complete-stop').hidden = !here;
  $('send').disabled = $('generate').disabled = on;  // one generation at a time
  $('document').readOnly = here;
}

// ---- generating ----

/** Runs one streamed generation; `onText` gets each piece of text. Returns {stats, error, stopped}. */
async function stream(path, body, conv, msg, onText) {
  const job = state.job = { controller: new AbortController(), conv, msg };
  busy(true);
  const t0 = performance.now();
  const seen = { first: null, last: null, chunks: 0, usage: null, finish: null };
  const figures = () => seen.first === null ? undefined : stats(t0, seen);
  try {
    for await (const chunk of api.generate(path, body, job.controller.signal)) {
      seen.usage = chunk.usage || seen.usage;
      const choice = chunk.choices?.find((c) => !c.index);
      if (!choice) continue;
      seen.finish = choice.finish_reason || seen.finish;
      const text = choice.delta?.content ?? choice.text ?? choice.message?.content ?? '';
      if (!text) continue;
      seen.last = performance.now();
      seen.first ??= seen.last;
      seen.chunks++;
      onText(text);
      schedulePaint();
    }
    return { stats: figures() ?? stats(t0, seen) };
  } catch (e) {
    if (e.name === 'AbortError') return { stats: figures(), stopped: true };
    return { stats: figures(), error: { status: e.status ?? null, text: api.describe(e) } };
  } finally {
    state.job = null;
    busy(false);
  }
}

function stats(t0, { first, last, chunks, usage, finish }) {
  const tokens = usage?.completion_tokens ?? chunks;
  return { tokens, ttft: first === null ? null : first - t0,
    tps: tokens > 1 && last > first ? ((tokens - 1) * 1000) / (last - first) : null, finish };
}

const withModel = (s) => ({ ...s, model: s.model || state.models[0] });

/** The request's messages: the replies that said something, roles alternating (a chat template may insist:
 *  after a failed reply, the next user message joins the one before it). */
function requestMessages(conv) {
  const out = [];
  for (const { role, content } of conv.messages) {
    if (!content) continue;
    if (out.at(-1)?.role === role) out.at(-1).content += `\n\n${content}`;
    else out.push({ role, content });
  }
  return out;
}

async function reply(conv) {
  const body = chatBody(withModel(conv.settings), requestMessages(conv));
  const msg = { role: 'assistant', content: '' };
  conv.messages.push(msg);
  persist();
  renderMessages();
  const result = await stream('/v1/chat/completions', body, conv, msg, (t) => { msg.content += t; });
  Object.assign(msg, result);
  persist();
  if (conv === state.current) renderMessages();
  renderList();
}

function send(e) {
  e.preventDefault();
  const input = $('input'), text = input.value, conv = state.current;
  if (state.job || !text.trim()) return;
  if (state.editing) conv.messages.splice(conv.messages.findLastIndex((m) => m.role === 'user'));
  setEditing(false);
  conv.messages.push({ role: 'user', content: text });
  input.value = '';
  autosize();
  renderList();
  reply(conv);
}

function regenerate() {
  const conv = state.current;
  if (state.job) return;
  if (conv.messages.at(-1)?.role === 'assistant') conv.messages.pop();
  reply(conv);
}

function setEditing(on) {
  state.editing = on;
  $('editing').hidden = !on;
}

function edit() {
  const conv = state.current, last = conv.messages.findLast((m) => m.role === 'user');
  if (state.job || !last) return;
  setEditing(true);
  $('input').value = last.content;
  autosize();
  $('input').focus();
}

async function complete() {
  const conv = state.current, doc = $('document');
  if (state.job) return;
  conv.document = doc.value;
  const body = completionBody(withModel(conv.settings), conv.document);
  const result = await stream('/v1/completions', body, conv, null, (t) => { conv.document += t; });
  state.completion.set(conv.id, result);
  persist();
  if (conv === state.current) {
    doc.value = conv.document;
    renderCompletionStatus();
  }
  renderList();
}

const stop = () => state.job?.controller.abort();

// ---- models and the API key ----

async function loadModels() {
  for (;;) {
    try {
      state.models = await api.models();
      notice('');
      renderModels();
      return;
    } catch (e) {
      if (e.status === 401) {
        const why = api.apiKey() ? 'The server refused this API key: enter the right one.'
          : 'This server needs an API key.';
        if (await askKey(why)) continue;
        notice('Without an API key the server refuses every request. Set one with “API key”.');
      } else if (e.status === 503) {
        notice(api.describe(e));
        await new Promise((r) => setTimeout(r, 1000));  // the model is loading: ask again
        continue;
      } else notice(`Could not list the models. ${api.describe(e)}`);
      return;
    }
  }
}

/** Opens the key dialog; true once a key was saved. */
function askKey(why) {
  const dlg = $('key-dialog');
  $('key-reason').textContent = why;
  $('key-form').elements.key.value = api.apiKey();
  if (!dlg.open) {
    dlg.returnValue = '';
    dlg.showModal();
  }
  return new Promise((resolve) => {
    dlg.addEventListener('close', () => resolve(dlg.returnValue === 'saved'), { once: true });
  });
}

function saveKey(e) {
  e.preventDefault();
  api.setApiKey($('key-form').elements.key.value.trim());
  $('key-dialog').close('saved');
}

async function changeKey() {
  if (await askKey('The key this page sends to the server.')) loadModels();
}

// ---- settings ----

const NUMBER_FIELDS = ['temperature', 'top_p', 'max_tokens'];

function openSettings() {
  const f = $('settings-form').elements, s = state.current.settings;
  f.system.value = s.system;
  for (const k of NUMBER_FIELDS) f[k].value = s[k] ?? '';
  f.extra.value = Object.keys(s.extra).length ? JSON.stringify(s.extra, null, 2) : '';
  $('settings-error').hidden = true;
  $('settings').showModal();
}

function settingsError(text) {
  $('settings-error').textContent = text;
  $('settings-error').hidden = false;
}

function saveSettings(e) {
  e.preventDefault();
  const f = $('settings-form').elements;
  let extra = {};
  try {
    extra = f.extra.value.trim() ? JSON.parse(f.extra.value) : {};
  } catch (err) {
    return settingsError(`The other fields are not JSON: ${err.message}`);
  }
  if (!extra || typeof extra !== 'object' || Array.isArray(extra)) {
    return settingsError('The other fields must be a JSON object: {"name": value, …}');
  }
  const bad = NUMBER_FIELDS.find((k) => f[k].validity.badInput);
  if (bad) return settingsError(`${bad} is not a number`);
  const s = state.current.settings;
  for (const k of NUMBER_FIELDS) s[k] = f[k].value === '' ? null : Number(f[k].value);
  Object.assign(s, { system: f.system.value, extra });
  persist();
  renderSummary();
  $('settings').close();
}

// ---- conversations ----

function select(conv) {
  state.current = conv;
  setEditing(false);
  document.body.classList.remove('drawer-open');
  $('menu').setAttribute('aria-expanded', 'false');
  persist();
  show();
}

function remove(conv) {
  if (state.job?.conv === conv) stop();
  state.convs = state.convs.filter((c) => c !== conv);
  if (state.current === conv) state.current = state.convs[0] || null;
  if (!state.current) addConversation(conv);
  select(state.current);
}

function rename(li, conv) {
  const input = el('input', 'rename');
  input.value = store.titleOf(conv);
  input.setAttribute('aria-label', 'New title');
  let finished = false;  // (removing the focused input fires its blur too)
  const done = (keep) => {
    if (finished) return;
    finished = true;
    if (keep) conv.title = input.value.trim();
    persist();
    renderList();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') done(true);
    if (e.key === 'Escape') done(false);
  });
  input.addEventListener('blur', () => done(true));
  li.querySelector('.title').replaceWith(input);
  input.select();
}

function onListClick(e) {
  const b = e.target.closest('button'), li = e.target.closest('li');
  const conv = li && state.convs.find((c) => c.id === li.dataset.id);
  if (!b || !conv) return;
  if (b.dataset.action === 'open') select(conv);
  else if (b.dataset.action === 'rename') rename(li, conv);
  else if (b.classList.contains('confirm')) remove(conv);
  else {  // a delete asks once more: a second click deletes
    b.classList.add('confirm');
    b.textContent = 'Delete?';
    b.addEventListener('blur', () => renderList(), { once: true });
  }
}

function exportAll() {
  const blob = new Blob([store.exportJSON(state.convs)], { type: 'application/json' });
  const a = el('a');
  a.href = URL.createObjectURL(blob);
  a.download = `pyserve-conversations-${new Date().toISOString().slice(0, 10)}.json`;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 60000);
}

async function importFile(e) {
  const file = e.target.files[0];
  e.target.value = '';  // the same file may be imported again
  if (!file) return;
  try {
    const convs = store.parseImport(await file.text());
    state.convs.unshift(...convs);
    notice('');
    select(convs[0]);
  } catch (err) {
    notice(`Could not import ${file.name}: ${err.message}`);
  }
}

// ---- events ----

async function copyText(text, b) {
  try {
    if (navigator.clipboard && window.isSecureContext) await navigator.clipboard.writeText(text);
    else {  // plain http on another host than localhost: no clipboard API
      const t = el('textarea');
      t.value = text;
      document.body.append(t);
      t.select();
      const ok = document.execCommand('copy');
      t.remove();
      if (!ok) throw new Error('refused');
    }
    b.textContent = 'Copied';
  } catch {
    b.textContent = 'Copy failed';
  }
}

function onMessagesClick(e) {
  const b = e.target.closest('button');
  if (!b) return;
  if (b.classList.contains('copy')) return copyText(b.closest('.code').querySelector('code').textContent, b);
  const i = [...$('messages').children].indexOf(b.closest('article'));
  const action = b.dataset.action;
  if (action === 'regenerate') regenerate();
  else if (action === 'edit') edit();
  else if (action === 'key') changeKey();
  else if (action === 'copy-message') copyText(state.current.messages[i].content, b);
}

function autosize() {  // the composer grows with its text, up to 240 px
  const input = $('input');
  input.style.height = 'auto';
  const height = input.scrollHeight + input.offsetHeight - input.clientHeight;  // (+ its borders)
  input.style.height = `${Math.min(height, 240)}px`;
  input.style.overflowY = height > 240 ? 'auto' : 'hidden';
}

function wire() {
  wireComposers();
  wireSidebar();
  wireDialogs();
  $('messages').addEventListener('click', onMessagesClick);
  $('model').addEventListener('change', () => { state.current.settings.model = $('model').value; persist(); });
  for (const b of document.querySelectorAll('.modes button')) {
    b.addEventListener('click', () => { state.current.mode = b.dataset.mode; persist(); show(); });
  }
}

function wireComposers() {
  $('composer').addEventListener('submit', send);
  $('input').addEventListener('input', autosize);
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('cancel-edit').addEventListener('click', () => { setEditing(false); $('input').value = ''; autosize(); });
  $('document').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && (e.ctrlKey || e.metaKey)) { e.preventDefault(); complete(); }
  });
  $('document').addEventListener('input', () => { state.current.document = $('document').value; persist(); });
  $('generate').addEventListener('click', complete);
  $('stop').addEventListener('click', stop);
  $('complete-stop').addEventListener('click', stop);
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape' && state.job) stop(); });
}

function wireSidebar() {
  $('conversations').addEventListener('click', onListClick);
  $('new').addEventListener('click', () => select(addConversation()));
  $('export').addEventListener('click', exportAll);
  $('import').addEventListener('change', importFile);
  $('key').addEventListener('click', changeKey);
  const drawer = (open) => {  // phones: the list slides over the page
    document.body.classList.toggle('drawer-open', open);
    $('menu').setAttribute('aria-expanded', open);
  };
  $('menu').addEventListener('click', () => drawer(!document.body.classList.contains('drawer-open')));
  $('scrim').addEventListener('click', () => drawer(false));
}

function wireDialogs() {
  $('key-form').addEventListener('submit', saveKey);
  $('key-cancel').addEventListener('click', () => $('key-dialog').close(''));
  $('open-settings').addEventListener('click', openSettings);
  $('settings-form').addEventListener('submit', saveSettings);
  $('settings-cancel').addEventListener('click', () => $('settings').close());
}

boot();
