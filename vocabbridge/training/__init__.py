"""What makes draft heads: self-distillation data from the target's own answers, chained-step
training, curves and progress, and the export of a trained head in vLLM's layouts.

- ``data.py``: training prompts rendered with the chat template, the target's greedy continuations,
  the hidden streams each head reads, top-k soft labels, written in shards;
- ``chain.py``: the chained draft steps as the engine and vLLM run them (training-time test), the
  loss, the held-out evaluation, the least-squares start;
- ``train.py``: ``train_head`` (the ``train-head`` command's library call);
- ``curves.py`` / ``progress.py``: the loss and acceptance curves (PNG), progress lines;
- ``export.py``: a head folder as a checkpoint vLLM serves (``export_for_vllm``).

It runs the target, so it may import ``vocabbridge.engine``; it never imports the bench, the server
or vLLM, and ``vocabbridge.heads`` (what the engine runs) never imports it.
"""
