"""The embedding pool process: a ROUTER for clients, a bounded queue, and N worker processes
with their own ONNX sessions."""
