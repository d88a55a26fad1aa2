"""Names of the tiny world's entities: the closed lexicon of capitalised syllable words every name is
built from (`name_lexicon`, the same for every world and seed) and the per-world allocator that keeps
every name word unique (`Names`). Pure Python, deterministic."""

from __future__ import annotations

import functools
import random

COMPANY_SUFFIXES = ("Works", "Labs", "Holdings", "Systems", "Foundry", "Trading", "Group", "Mills")
_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr", "l", "m", "n", "p", "pr",
           "qu", "r", "s", "sh", "st", "t", "th", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ai", "ei", "ou", "y")
_CODAS = ("", "", "", "", "n", "r", "l", "s", "th", "x", "m", "nd", "rk")


def _syllable_word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)).capitalize()


@functools.lru_cache(maxsize=8)
def name_lexicon(size: int) -> tuple[str, ...]:
    """The closed set of capitalised syllable words every name is built from (the same for every world
    and seed): each is one token of the world's tokenizer (` Word`), so copying a name out of a passage
    is copying one or two tokens. Words of 3–9 letters, none a prefix of an English word of the fixed
    texts (`STOP_WORDS`) or of a company suffix. Fresh warm-start worlds and the target world draw from
    the same lexicon with different combinations and facts, so every name token is trained and
    memorising facts cannot work."""
    rng = random.Random("name-lexicon-v1")
    words: list[str] = []
    seen: set[str] = set()
    for _ in range(200 * size + 10_000):
        w = _syllable_word(rng, rng.choice((1, 2, 2)))
        if 3 <= len(w) <= 9 and w not in seen and not any(f.startswith(w) for f in _FIXED_WORDS):
            seen.add(w)
            words.append(w)
            if len(words) == size:
                return tuple(words)
    raise ValueError(f"cannot build a name lexicon of {size} words from the syllable set")


STOP_WORDS = frozenset(
    "the and but for who what which when where why how was were are is its his her him she they them than "
    "then that this there these those with from into onto year born works city company country founded by "
    "headquartered industry occupation capital doc title question answer search think information need find "
    "results mention will again found beijing you your can call must reason every time get new knowledge "
    "conduct reasoning first inside lack some engine query return top searched between provide directly "
    "without detailed illustrations example".split())
"""Lower-cased English words of the prompt, templates and trace phrases: never used as name words."""
_FIXED_WORDS = tuple(w.capitalize() for w in sorted(STOP_WORDS)) + COMPANY_SUFFIXES
# a name word is never a prefix of these (the tokenizer matches name words inside longer words too)


class Names:
    """Names from the lexicon (`name_lexicon`): every name word is unique within a world, so a search for
    a name finds exactly its passage; full names reserved in advance are avoided (the warm start reserves
    the target world's, so it never trains on a held-out entity — with other facts or not)."""

    def __init__(self, rng: random.Random, lexicon: tuple[str, ...], reserved: list[str],
                 taken_words: list[str]):
        self.rng = rng
        self.lexicon = lexicon
        self.used = set(reserved)
        self.used_words = {w for name in taken_words for w in name.split() if w not in COMPANY_SUFFIXES}

    def _unique(self, make, max_tries: int = 10_000) -> str:
        for _ in range(max_tries):
            name = make()
            distinct = [w for w in name.split() if w not in COMPANY_SUFFIXES]
            if name not in self.used and not any(w in self.used_words for w in distinct) \
                    and len(set(distinct)) == len(distinct):
                self.used.add(name)
                self.used_words.update(distinct)
                return name
        raise RuntimeError(f"could not find a fresh name: the world needs more than the {len(self.lexicon)} "
                           f"name words (raise generator.name_words)")

    def _word(self) -> str:
        return self.rng.choice(self.lexicon)

    def person(self) -> str:
        return self._unique(lambda: f"{self._word()} {self._word()}")

    def city(self) -> str:
        return self._unique(self._word)

    def country(self) -> str:
        return self._unique(self._word)

    def company(self) -> str:
        return self._unique(lambda: f"{self._word()} {self.rng.choice(COMPANY_SUFFIXES)}")
