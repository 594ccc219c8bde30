// Conversations, kept in this browser's localStorage (one JSON array under one key; a few hundred KB at
// most for long chats, written when a reply ends and on each edit), and their export / import as JSON.
//
// A conversation: {id, title, created, mode: 'chat' | 'complete', settings (settings.js),
//                  messages: [{role: 'user' | 'assistant', content, stats?, error?, stopped?}],
//                  document (the completion mode's text)}

import { defaults, normalize } from './settings.js';

const KEY = 'pyserve.conversations';
const CURRENT = 'pyserve.current';
const FORMAT = 'pyserve-conversations';

export function load() {
  try {
    const list = JSON.parse(localStorage.getItem(KEY) || '[]');
    return Array.isArray(list) ? list.map(clean).filter(Boolean) : [];
  } catch {
    return [];  // unreadable storage: start afresh rather than not at all
  }
}

/** Writes every conversation; false when the browser refused (storage full or disabled). */
export function save(conversations, currentId) {
  try {
    localStorage.setItem(KEY, JSON.stringify(conversations));
    localStorage.setItem(CURRENT, currentId ?? '');
    return true;
  } catch {
    return false;
  }
}

export const currentId = () => localStorage.getItem(CURRENT) || null;

export function create(settings, mode = 'chat') {
  return { id: newId(), title: '', created: Date.now(), mode, settings: normalize(settings), messages: [],
    document: '' };
}

const newId = () => crypto.getRandomValues(new Uint32Array(2)).join('-');

export function isEmpty(conv) {
  return conv.messages.length === 0 && !conv.document;
}

/** The title shown in the list: the given one, else the start of the first message or of the document. */
export function titleOf(conv) {
  if (conv.title) return conv.title;
  const text = (conv.messages.find((m) => m.role === 'user')?.content || conv.document || '').trim();
  return text ? text.replace(/\s+/g, ' ').slice(0, 48) : 'New conversation';
}

export function exportJSON(conversations) {
  return JSON.stringify({ format: FORMAT, version: 1, conversations }, null, 2);
}

/** Conversations from an exported file (or a bare array, or one conversation), each with a fresh id. Throws
 *  an Error naming what is wrong when the text is not such a file. */
export function parseImport(text) {
  const data = JSON.parse(text);
  const list = Array.isArray(data) ? data : Array.isArray(data?.conversations) ? data.conversations : [data];
  const out = list.map(clean);
  if (!out.length || out.some((c) => !c)) throw new Error('not a pyserve conversations file');
  return out.map((c) => ({ ...c, id: newId() }));
}

/** A well-formed conversation from stored or imported data, or null. */
function clean(c) {
  if (!c || typeof c !== 'object' || !Array.isArray(c.messages)) return null;
  const messages = c.messages
    .filter((m) => m && ['user', 'assistant'].includes(m.role) && typeof m.content === 'string')
    .map((m) => ({ role: m.role, content: m.content, stats: objectOr(m.stats), error: objectOr(m.error),
      stopped: m.stopped === true || undefined }));  // (undefined: left out of the JSON)
  return {
    id: typeof c.id === 'string' && c.id ? c.id : newId(),
    title: typeof c.title === 'string' ? c.title : '',
    created: Number.isFinite(c.created) ? c.created : Date.now(),
    mode: c.mode === 'complete' ? 'complete' : 'chat',
    settings: normalize({ ...defaults(), ...objectOr(c.settings) }),
    messages,
    document: typeof c.document === 'string' ? c.document : '',
  };
}

const objectOr = (v) => (v && typeof v === 'object' && !Array.isArray(v) ? v : undefined);
