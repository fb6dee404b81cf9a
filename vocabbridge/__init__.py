"""vocabbridge: speculative decoding with a drafter whose tokenizer differs from the target's."""

from .errors import VocabBridgeError
from .tokenizer import TokenizerView, load_tokenizer

__version__ = "0.1.0"
__all__ = ["TokenizerView", "VocabBridgeError", "__version__", "load_tokenizer"]
