// Markdown → DOM nodes, for the model's replies: headings, paragraphs, lists (nested), block quotes, tables,
// fenced code blocks (with a Copy button), rules; inline code, bold, italic, strike-through, links.
//
// Safety: every character of a reply ends up in a text node (createTextNode / textContent) or decides which
// element this module creates; no string ever goes through innerHTML. So `<script>` or `<img onerror=…>` in
// a reply is shown as text. Links keep http(s) and mailto targets only; images show as their alt text (the
// page loads nothing from other hosts). Unfinished syntax while streaming (an open ``` fence) renders as
// far as it goes.

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
const HEADING = /^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( *)([-*+]|\d{1,9}[.)])(?: +(.*))?$/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const SAFE_URL = /^(https?:|mailto:)/i;
const INLINE = new RegExp([
  /\\(?<esc>[!-/:-@[-`{-~])/,
  /(?<ticks>`+)(?<code>[^`]|[^`][\s\S]*?[^`])\k<ticks>(?!`)/,
  /\*\*(?<strong>\S(?:[\s\S]*?\S)?)\*\*/,
  /(?<![\p{L}\p{N}])__(?<strong2>\S(?:[\s\S]*?\S)?)__(?![\p{L}\p{N}])/,
  /\*(?<em>[^\s*](?:[\s\S]*?[^\s*])?)\*/,
  /(?<![\p{L}\p{N}_])_(?<em2>[^\s_](?:[\s\S]*?[^\s_])?)_(?![\p{L}\p{N}_])/,
  /~~(?<del>\S(?:[\s\S]*?\S)?)~~/,
  /(?<bang>!?)\[(?<label>[^\]\n]*)\]\(\s*(?<href>[^\s()]*)\s*\)/,
].map((r) => r.source).join('|'), 'u');

/** The reply `text` as a DocumentFragment. */
export function render(text) {
  const frag = document.createDocumentFragment();
  blocks(text.replace(/\r\n?/g, '\n').split('\n'), frag);
  return frag;
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function blocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) i++;
    else if ((m = FENCE.exec(line))) i = codeBlock(lines, i, m, parent);
    else if ((m = HEADING.exec(line))) { parent.append(inline(el(`h${m[1].length}`), m[2])); i++; }
    else if (RULE.test(line)) { parent.append(el('hr')); i++; }
    else if (QUOTE.test(line)) i = quote(lines, i, parent);
    else if (ITEM.test(line)) i = list(lines, i, parent);
    else if (isTable(lines, i)) i = table(lines, i, parent);
    else i = paragraph(lines, i, parent);
  }
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line)
    || isTable(lines, i);
}

function paragraph(lines, i, parent) {
  const body = [lines[i++]];
  while (i < lines.length && lines[i].trim() && !startsBlock(lines, i)) body.push(lines[i++]);
  parent.append(inline(el('p'), body.join('\n').trim()));
  return i;
}

function codeBlock(lines, i, m, parent) {
  const fence = m[1], body = [];
  let j = i + 1;
  const closes = (line) => {  // a run of the same fence character, at least as long
    const t = line.trim();
    return t[0] === fence[0] && t.length >= fence.length && /^([`~])\1*$/.test(t);
  };
  while (j < lines.length && !closes(lines[j])) body.push(lines[j++]);
  parent.append(codeElement(body.join('\n'), m[2]));
  return j + 1;
}

/** <div class="code"><div class="code-head">LANG <button class="copy">Copy</button></div><pre><code>… */
export function codeElement(code, lang) {
  const box = el('div', 'code'), head = el('div', 'code-head');
  const copy = el('button', 'copy', 'Copy');
  copy.type = 'button';
  head.append(el('span', 'lang', lang || 'text'), copy);
  const pre = el('pre');
  pre.append(el('code', '', code));
  box.append(head, pre);
  return box;
}

function quote(lines, i, parent) {
  const body = [];
  let m;
  while (i < lines.length && (m = QUOTE.exec(lines[i]))) { body.push(m[1]); i++; }
  const q = el('blockquote');
  blocks(body, q);
  parent.append(q);
  return i;
}

const indentOf = (line) => line.length - line.trimStart().length;

function list(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length, ordered = /\d/.test(first[2]);
  const sibling = (m) => m && m[1].length === indent && /\d/.test(m[2]) === ordered;
  const items = [];  // each item's lines, dedented to its text's column (so a nested list parses again)
  let column = 0;
  for (; i < lines.length; i++) {
    const line = lines[i], m = ITEM.exec(line);
    if (sibling(m)) {
      items.push([m[3] ?? '']);
      column = indent + m[2].length + 1;
    } else if (!line.trim()) {  // a blank line: the list goes on if an item or an indented line follows
      let j = i + 1;
      while (j < lines.length && !lines[j].trim()) j++;
      if (j === lines.length || !(indentOf(lines[j]) > indent || sibling(ITEM.exec(lines[j])))) break;
      items.at(-1).push('');
    } else if (indentOf(line) > indent) {
      items.at(-1).push(line.slice(Math.min(indentOf(line), column)));
    } else break;
  }
  const listEl = el(ordered ? 'ol' : 'ul');
  if (ordered && parseInt(first[2], 10) !== 1) listEl.start = parseInt(first[2], 10);
  for (const body of items) {
    const li = el('li');
    blocks(body, li);
    listEl.append(li);
  }
  parent.append(listEl);
  return i;
}

function isTable(lines, i) {
  return lines[i].includes('|') && i + 1 < lines.length && lines[i + 1].includes('-') && TABLE_SEP.test(lines[i + 1]);
}

function cells(line) {
  let t = line.trim();
  if (t.startsWith('|')) t = t.slice(1);
  if (t.endsWith('|')) t = t.slice(0, -1);
  return t.split('|').map((c) => c.trim());
}

function table(lines, i, parent) {
  const wrap = el('div', 'table'), tbl = el('table'), head = el('tr');
  for (const c of cells(lines[i])) head.append(inline(el('th'), c));
  tbl.append(el('thead'), el('tbody'));
  tbl.tHead.append(head);
  i += 2;
  for (; i < lines.length && lines[i].includes('|') && lines[i].trim(); i++) {
    const row = el('tr');
    for (const c of cells(lines[i])) row.append(inline(el('td'), c));
    tbl.tBodies[0].append(row);
  }
  wrap.append(tbl);
  parent.append(wrap);
  return i;
}

function inline(parent, text) {
  let rest = text;
  while (rest) {
    const m = INLINE.exec(rest);
    if (!m) { addText(parent, rest); break; }
    addText(parent, rest.slice(0, m.index));
    parent.append(inlineNode(m));
    rest = rest.slice(m.index + m[0].length);
  }
  return parent;
}

function addText(parent, s) {
  s.split('\n').forEach((part, k) => {
    if (k) parent.append(el('br'));
    if (part) parent.append(document.createTextNode(part));
  });
}

function inlineNode(m) {
  const g = m.groups;
  if (g.esc !== undefined) return document.createTextNode(g.esc);
  if (g.code !== undefined) return el('code', '', g.code.replace(/^ ([\s\S]*) $/, '$1'));
  if ((g.strong ?? g.strong2) !== undefined) return inline(el('strong'), g.strong ?? g.strong2);
  if ((g.em ?? g.em2) !== undefined) return inline(el('em'), g.em ?? g.em2);
  if (g.del !== undefined) return inline(el('del'), g.del);
  if (g.bang) return el('span', 'image-alt', `[image: ${g.label || g.href}]`);
  if (!SAFE_URL.test(g.href)) return document.createTextNode(m[0]);
  const a = inline(el('a'), g.label || g.href);
  a.href = g.href;
  a.target = '_blank';
  a.rel = 'noopener noreferrer';
  return a;
}
