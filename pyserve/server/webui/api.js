// The server's API, from the same origin: the model list, streamed generations (server-sent events over
// fetch, so an AbortController can stop one: aborting closes the connection and the server aborts the
// engine request), the API key kept in this browser, and errors as sentences a person can act on.

const KEY = 'pyserve.apiKey';

export const apiKey = () => localStorage.getItem(KEY) || '';
export const setApiKey = (key) => (key ? localStorage.setItem(KEY, key) : localStorage.removeItem(KEY));

/** An error the server answered (status: the HTTP status, 0 for an error event inside a stream). */
export class ApiError extends Error {
  constructor(status, message, { code = null, type = null, retryAfter = null } = {}) {
    super(message);
    Object.assign(this, { name: 'ApiError', status, code, type, retryAfter });
  }
}

function headers(json) {
  const h = json ? { 'Content-Type': 'application/json' } : {};
  if (apiKey()) h.Authorization = `Bearer ${apiKey()}`;
  return h;
}

async function errorOf(res) {
  let err = {};
  try {
    err = (await res.json()).error || {};
  } catch { /* not OpenAI's error JSON: the status says enough */ }
  const retry = res.headers.get('Retry-After');
  return new ApiError(res.status, err.message || res.statusText || 'request failed',
    { code: err.code, type: err.type, retryAfter: retry === null ? null : Number(retry) });
}

/** The served model ids. */
export async function models() {
  const res = await fetch('/v1/models', { headers: headers(false) });
  if (!res.ok) throw await errorOf(res);
  return (await res.json()).data.map((m) => m.id);
}

/** Yields the chunks of a streamed generation (a non-streamed reply, asked for by `extra`, as one chunk).
 *  Throws ApiError for an error status or an error event, AbortError when `signal` aborts. */
export async function* generate(path, body, signal) {
  const res = await fetch(path, { method: 'POST', headers: headers(true), body: JSON.stringify(body), signal });
  if (!res.ok) throw await errorOf(res);
  if (!(res.headers.get('Content-Type') || '').startsWith('text/event-stream')) {
    yield await res.json();
    return;
  }
  for await (const data of events(res.body)) {
    if (data === '[DONE]') return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new ApiError(0, chunk.error.message, chunk.error);
    yield chunk;
  }
  throw new ApiError(0, 'the stream ended before the reply was complete');
}

/** The data fields of the SSE events of a byte stream. */
async function* events(stream) {
  const reader = stream.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value.replace(/\r\n?/g, '\n');
      let end;
      while ((end = buf.indexOf('\n\n')) >= 0) {
        const lines = buf.slice(0, end).split('\n');
        buf = buf.slice(end + 2);
        const data = lines.filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, ''));
        if (data.length) yield data.join('\n');
      }
    }
  } finally {
    reader.releaseLock();
  }
}

/** What went wrong, said for a person. */
export function describe(e) {
  if (!(e instanceof ApiError)) {
    if (e instanceof TypeError) return `Could not reach the server (${e.message}). Is pyserve still running?`;
    return `Something went wrong: ${e.message}`;
  }
  const retry = Number.isFinite(e.retryAfter) ? ` Try again in ${Math.ceil(e.retryAfter)} s.` : '';
  switch (e.status) {
    case 0: return `The server stopped the reply with an error: ${e.message}`;
    case 401: return `The server needs a valid API key (401): ${e.message} Set the key with “API key”.`;
    case 429: return `Too many requests (429): ${e.message}${retry}`;
    case 503: return `The server is unavailable (503): ${e.message}.${retry}`;
    default: return `The server refused the request (${e.status}): ${e.message}`;
  }
}
