"""/v1/completions: the request and reply models, the serving (echo, logprobs for scoring, prompt logprobs)
and fill-in-the-middle's prompt layout (fim.py, shared with /infill)."""
