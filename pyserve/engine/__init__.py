"""The engine layer: the C++ engine's Python faces (LLM offline, AsyncLLM for trio), tokenizer and
detokenizer, sampling parameters, outputs, stop strings, and where the model file comes from."""
