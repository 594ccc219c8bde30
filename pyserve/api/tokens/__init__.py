"""/tokenize, /detokenize, /apply-template and /tokenizer_info: the prompt a request would give the model."""
