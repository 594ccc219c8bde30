// A conversation's settings, the request bodies built from them, and the settings a link presets.
//
// settings = {model, system, temperature, top_p, max_tokens, extra}: null (or '') leaves a field to the
// server's default; `extra` is any other request field, as raw JSON, merged into the body last.

const NUMBERS = ['temperature', 'top_p', 'max_tokens'];
const STRINGS = ['model', 'system'];

export function defaults() {
  return { model: null, system: '', temperature: null, top_p: null, max_tokens: null, extra: {} };
}

export function normalize(s) {
  const out = defaults();
  for (const k of STRINGS) if (typeof s?.[k] === 'string') out[k] = s[k];
  for (const k of NUMBERS) if (s?.[k] !== undefined && s[k] !== '') out[k] = s[k];  // a wrong type: the server says so
  if (s?.extra && typeof s.extra === 'object' && !Array.isArray(s.extra)) out.extra = { ...s.extra };
  return out;
}

/** What `/?temperature=0&max_tokens=24&model=NAME&mode=complete&stop=["\n"]` presets: {settings, mode}, or
 *  null for a bare `/`. Values are read as JSON where they parse (0, true, ["\n"]) and as text otherwise;
 *  `model` and `system` are always text; any other name goes into `extra`. */
export function fromQuery(search) {
  const params = new URLSearchParams(search);
  if (![...params.keys()].length) return null;
  const settings = defaults();
  let mode = null;
  for (const [k, v] of params) {
    if (k === 'mode') mode = v === 'complete' || v === 'completion' ? 'complete' : 'chat';
    else if (STRINGS.includes(k)) settings[k] = v;
    else if (NUMBERS.includes(k)) settings[k] = parseValue(v);
    else settings.extra[k] = parseValue(v);
  }
  return { settings, mode };
}

function parseValue(v) {
  try {
    return JSON.parse(v);
  } catch {
    return v;
  }
}

function sampling(s) {
  const body = { model: s.model };
  for (const k of NUMBERS) if (s[k] !== null && s[k] !== '') body[k] = s[k];
  return body;
}

/** The /v1/chat/completions body for `messages` ([{role, content}], the system prompt put first here). */
export function chatBody(s, messages) {
  const system = s.system.trim() ? [{ role: 'system', content: s.system }] : [];
  return { ...sampling(s), messages: [...system, ...messages], stream: true,
    stream_options: { include_usage: true }, ...s.extra };
}

/** The /v1/completions body: the document is the prompt, the model continues it. */
export function completionBody(s, prompt) {
  return { ...sampling(s), prompt, stream: true, stream_options: { include_usage: true }, ...s.extra };
}
