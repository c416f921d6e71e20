"""Where a local embedding model's files sit in RECALL_LOCAL_MODEL_DIR, each in order of preference.

Here, outside memories/embeddings, so that settings can check the directory
before the apps load (importing the embedder would pull in numpy and Django's
settings themselves).
"""

from __future__ import annotations

MODEL = ("model.onnx", "onnx/model.onnx")
TOKENIZER = ("tokenizer.json", "onnx/tokenizer.json")
