"""Token ids → the text a client sees, one token at a time: incremental UTF-8 (a character split
across tokens waits for its last byte), special tokens skipped, the stop token left out, and stop
strings cut the text (what might be the start of a stop string is held back until it is not).

>>> class V:  # a stand-in view: id → bytes
...     tokens = [b"Hel", b"lo", b" wor", b"ld", b"\\xec\\x95", b"\\x88"]
...     special_ids = frozenset()
>>> out = OutputText(V(), stop=("wor",))
>>> [out.add(t) for t in (0, 1, 2)], out.take(), out.stop_reason
([False, False, True], 'Hello ', 'wor')
>>> out = OutputText(V())
>>> out.add(4), out.take(), out.add(5), out.take()
(False, '', False, '안')
"""

from __future__ import annotations

import codecs


class OutputText:
    def __init__(
        self,
        view,
        *,
        stop: tuple[str, ...] = (),
        stop_ids: frozenset[int] = frozenset(),
        skip_special: bool = True,
        include_stop: bool = False,
    ):
        self.view = view
        self.stop = stop
        self.stop_ids = stop_ids
        self.skip = view.special_ids if skip_special else frozenset()
        self.include_stop = include_stop
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # all text so far (cut at a stop string)
        self.sent = 0  # characters of ``text`` handed out by take()
        self.tokens: list[int] = []  # every token consumed, stop tokens included
        self.stop_reason: str | int | None = None  # the stop string or stop token id that ended the text

    def add(self, token: int) -> bool:
        """Consume one token; True when a stop string or a stop token ends the output here."""
        self.tokens.append(token)
        if token in self.stop_ids:
            self.stop_reason = token
            self.text += self._decoder.decode(b"", final=True)
            return True
        if token in self.skip:
            return False
        self.text += self._decoder.decode(self.view.tokens[token] or b"")
        if self.stop:
            start = max(0, self.sent - max(map(len, self.stop)))
            hits = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
            if hits:
                i, s = min(hits)
                self.text = self.text[: i + len(s) if self.include_stop else i]
                self.stop_reason = s
                return True
        return False

    def take(self, *, final: bool = False) -> str:
        """The text not handed out yet, minus a tail that could still become a stop string."""
        if final:
            self.text += self._decoder.decode(b"", final=True)
        end = len(self.text) if final or self.stop_reason is not None else len(self.text) - self._held_back()
        out = self.text[self.sent : end]
        self.sent = max(self.sent, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:n]):
                    best = n
                    break
        return best
