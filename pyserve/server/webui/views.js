// The page's pieces as DOM nodes: a message of the chat, a conversation of the list, a reply's figures.
// Text goes in as text nodes; replies through markdown.js, which does the same.

import { render } from './markdown.js';
import { titleOf } from './store.js';

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

export function button(text, action, label) {
  const b = el('button', '', text);
  b.type = 'button';
  b.dataset.action = action;
  if (label) {
    b.title = label;
    b.setAttribute('aria-label', label);
  }
  return b;
}

/** One message: <article class="msg ROLE [pending]"> body, figures, error and its buttons. `place` says
 *  whether it is the last user message (editable) or the last message (a reply to regenerate). */
export function messageView(msg, place) {
  const art = el('article', `msg ${msg.role}`);
  fill(art, msg, place);
  return art;
}

/** (Re)draws `art` from `msg`: also each frame of a streaming reply. */
export function fill(art, msg, { lastUser = false, last = false, pending = false } = {}) {
  art.classList.toggle('pending', pending);
  const body = el('div', msg.role === 'assistant' ? 'body md' : 'body');
  if (msg.role === 'assistant') body.append(render(msg.content));
  else body.textContent = msg.content;
  const parts = [body];
  const figures = msg.stats || msg.stopped ? statsText(msg.stats, msg.stopped) : '';
  if (figures) parts.push(el('div', 'meta', figures));
  if (msg.error) parts.push(errorView(msg.error));
  if (!pending) parts.push(actions(msg, lastUser, last));
  art.replaceChildren(...parts);
}

function errorView(error) {
  const box = el('div', 'error');
  box.setAttribute('role', 'alert');
  box.append(el('span', '', String(error.text ?? error.message ?? 'error')));
  if (error.status === 401) box.append(button('Set API key', 'key'));
  box.append(button('Retry', 'regenerate'));
  return box;
}

function actions(msg, lastUser, last) {
  const bar = el('div', 'actions');
  if (msg.role === 'user' && lastUser) bar.append(button('Edit', 'edit', 'Edit and resend this message'));
  if (msg.role === 'assistant') {
    if (msg.content) bar.append(button('Copy', 'copy-message', 'Copy the reply as Markdown'));
    if (last && !msg.error) bar.append(button('Regenerate', 'regenerate', 'Generate this reply again'));
  }
  return bar;
}

/** "24 tokens · 41.3 tokens/s · TTFT 85 ms", with how the reply ended when it was not the model's choice. */
export function statsText(stats, stopped) {
  const parts = [];
  if (stats) {
    const { tokens, tps, ttft, finish } = stats;
    parts.push(`${Number(tokens)} token${Number(tokens) === 1 ? '' : 's'}`);
    if (Number.isFinite(tps)) parts.push(`${Number(tps).toFixed(1)} tokens/s`);
    if (Number.isFinite(ttft)) parts.push(`TTFT ${Math.round(ttft)} ms`);
    if (finish === 'length') parts.push('cut at max_tokens');
  }
  if (stopped) parts.push('stopped');
  return parts.join(' · ');
}

export function conversationItem(conv, active) {
  const li = el('li', active ? 'active' : '');
  li.dataset.id = conv.id;
  const open = button(titleOf(conv), 'open');
  open.className = 'title';
  if (conv.mode === 'complete') open.prepend(el('span', 'badge', 'text'));
  li.append(open, button('✎', 'rename', 'Rename'), button('×', 'delete', 'Delete'));
  return li;
}

export function emptyHint() {
  return el('p', 'hint', 'Ask something. For a base model, Completion mode (it continues a text) may suit it '
    + 'better than chat.');
}
