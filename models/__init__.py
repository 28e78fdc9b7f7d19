"""Models: the model store, decoder and embedding sessions, KV state (snapshot, park,
spill), sampling, tokenizer helpers."""
