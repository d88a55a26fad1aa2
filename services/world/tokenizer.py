"""The tiny world's tokenizer: byte-level BPE trained with `tokenizers` on world text (the target world's
known entities and generic worlds of the same settings: passages, questions, the full Search-R1 prompt,
trace phrases and observation framing), so prompts and traces tokenize compactly, plus one token per
name word. Saved as a `PreTrainedTokenizerFast` directory that `AutoTokenizer.from_pretrained` and vLLM
load.

Vocabulary (default 1,024 BPE + 640 name words = 1,664): ids 0–2 are the special tokens `<|endoftext|>`
(padding), `<|im_start|>`, `<|im_end|>` (EOS); then the BPE; then the eight protocol tags `<think>
</think> <search> </search> <information> </information> <answer> </answer>`, added as *non-special*
tokens: one id each, yet kept when a decoder skips special tokens (vLLM does by default), so stop
strings and reward parsing see them; last, every name word with its leading space (` Grix`), also
non-special, so a name mid-sentence is one token per word (at the start of a line or after a quote it
falls back to BPE pieces). The chat template is Qwen's shape: `<|im_start|>{role}\\n{content}<|im_end|>\\n`,
generation prompt `<|im_start|>assistant\\n`.

Why not train on the target world's own text: its unknown entities' names are frequent there, so the
BPE merges them into whole-name tokens that no warm-start trace holds (the warm start reads freshly
generated worlds); a held-out name was then a token the model had never read or written.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from searchr1.core.protocol import TAG_TOKENS, TEMPLATES, format_docs, format_observation, make_prompt
from searchr1.world.chat import IM_END, IM_START, PAD, SPECIAL_TOKENS
from searchr1.world.traces import PHRASES

if TYPE_CHECKING:
    from searchr1.world.generator import Entity, Question, World
    from searchr1.world.settings import GeneratorSettings, TokenizerSettings


GENERIC_SEED_BASE = 2_000_000_011
"""Seeds of the generic worlds the tokenizer is trained on (far from user worlds and warm-start worlds)."""

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _world_texts(world: World, entities: list[Entity], questions: list[Question],
                 rng: random.Random) -> list[str]:
    texts = [world.passage(e) for e in entities]
    for q in questions:
        texts.append(f"{IM_START}user\n{make_prompt(q.text)}{IM_END}\n{IM_START}assistant\n")
    for e in entities:
        for attr in sorted(e.attrs):
            texts.append(world.fact_sentence(e, attr))
            texts.append(world.need_phrase(e, attr))
    corpus = world.corpus_cache()
    for _ in range(max(10, len(entities) // 4)):
        texts.append(format_observation(format_docs(rng.sample(corpus, min(3, len(corpus))))))
    return texts


def training_texts(world: World, generator: GeneratorSettings, settings: TokenizerSettings) -> list[str]:
    """The text the BPE is trained on, in a fixed order: the target world's *known* entities (their
    facts are memorised) and `settings.generic_worlds` other worlds generated with the same settings
    (seeds of their own), plus the fixed prompt and trace phrases.

    The target world's unknown entities are left out on purpose: trained on them, the BPE merges
    their (frequent) names into whole-name tokens that no warm-start trace ever contains (the warm
    start reads freshly generated worlds), so the model could neither read nor write those names.
    Name words are added as tokens of their own on top (`build_tokenizer`), so every name — of the warm
    start's worlds and of the target world — is the same kind of tokens."""
    from searchr1.world.generator import generate_world

    rng = random.Random(f"tokenizer-{world.seed}")
    known = world.known_entities()
    texts = _world_texts(world, known, world.questions(known=True), rng)
    for i in range(settings.generic_worlds):
        other = generate_world(generator, GENERIC_SEED_BASE + i, known=known)
        unknown = [e for e in other.entities if not e.known]
        texts.extend(_world_texts(other, unknown, other.questions(known=False), rng))
    texts.extend(TEMPLATES.values())
    texts.extend(PHRASES)
    return texts


def build_tokenizer(world: World, generator: GeneratorSettings, settings: TokenizerSettings, out: str | Path):
    """Train the BPE (`training_texts`) and save a `PreTrainedTokenizerFast` into `out`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from searchr1.world.generator import name_lexicon

    texts = training_texts(world, generator, settings)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size - len(TAG_TOKENS),
        min_frequency=settings.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAG_TOKENS])
    # every name word, with its leading space, is one token (copying a name = copying its word tokens)
    tok.add_tokens([AddedToken(" " + w, special=False, normalized=False)
                    for w in name_lexicon(generator.name_words)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def load_tokenizer(directory: str | Path):
    """`AutoTokenizer.from_pretrained(directory)` (a tokenizer or model directory)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))
