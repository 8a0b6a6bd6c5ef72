"""A tiny Llama for the real vLLM, built offline and deterministically: no hub, no download.

:func:`build` writes a Hugging Face model folder that ``vllm serve`` loads as it would a real
Llama 3: ``config.json`` (``LlamaForCausalLM``: hidden size 128, 2 layers, 2 attention heads of
head size 64, which vLLM's CPU attention takes), the weights in ``model.safetensors`` (seeded
random numbers), a byte-level BPE tokenizer trained on a corpus this module generates
(``tokenizer.json``, a vocabulary of :data:`VOCAB_SIZE` with Llama 3's special tokens) and
``tokenizer_config.json`` with a chat template. The same seed gives the same bytes.

What a test needs of a random model's greedy output, and how the weights give it:

- it does not stop early: the rows of the output layer for the end tokens are zero, so their
  logit is 0 while the largest logit is always well above it (greedy never picks them; a
  sampled one almost never);
- its text is printable: the rows of tokens that are not printable ASCII (lone bytes of
  multi-byte characters, control bytes) are zero too, so no chunk holds half a character;
- special tokens appear in it now and then, as with a real model (vLLM sends them as empty
  chunks): :data:`EMITTED_SPECIAL` keeps a row, scaled up so that it wins some steps;
- greedy choices are not near ties: the logits spread over several units, far more than the
  float error between a prefill and a decode step, so a generation continued from its own
  tokens goes on with the same tokens.

Two chat templates: :data:`PLAIN_TEMPLATE` (the folder's default) and :data:`TRIM_TEMPLATE`,
which trims each message's content as Llama 3's template does. A request selects the second
with ``"chat_template": TRIM_TEMPLATE`` (vLLM started with ``--trust-request-chat-template``),
or a server with ``--chat-template <folder>/trim_template.jinja``.

The imports of numpy, safetensors and tokenizers are inside the functions: this module runs
under the vLLM virtualenv's Python (``python tiny_model.py OUT``), which has them, while the
project's own environment, where it is type-checked and imported, needs none of them.
:mod:`streamsafe_bench.vllm_engine` builds the folder on first use (:func:`ensure_built`).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "EMITTED_SPECIAL",
    "MODEL_NAME",
    "PLAIN_TEMPLATE",
    "RECIPE",
    "TRIM_TEMPLATE",
    "build",
    "ensure_built",
]

#: The served model's name (``--served-model-name``) and the folder's name stem.
MODEL_NAME = "tiny-llama"
#: The recipe's version, part of the folder's name: a change to this module that changes the
#: bytes it writes bumps it, so a cached folder of an older recipe is not used.
RECIPE = 1
#: The seed of the corpus, the tokenizer's training order and the weights.
SEED = 20
#: Tokens in the vocabulary, special tokens included.
VOCAB_SIZE = 4096
HIDDEN = 128
LAYERS = 2
HEADS = 2
HEAD_DIM = 64
INTERMEDIATE = 256
MAX_POSITIONS = 2048

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
#: Llama 3's special tokens, plus reserved ones as it has.
SPECIAL_TOKENS = [
    BOS,
    EOS,
    "<|start_header_id|>",
    "<|end_header_id|>",
    EOT,
    "<|finetune_right_pad_id|>",
    *(f"<|reserved_special_token_{i}|>" for i in range(10)),
]
#: The special token a generation emits now and then (an empty chunk in vLLM's stream).
EMITTED_SPECIAL = "<|reserved_special_token_0|>"
#: How much larger than an ordinary row :data:`EMITTED_SPECIAL`'s output row is (tuned so that
#: it is a few per cent of greedy tokens).
EMITTED_SPECIAL_SCALE = 1.6
#: The standard deviation of an output-layer weight: logits spread about 0.5 * sqrt(128) = 5.7.
LOGIT_WEIGHT_STD = 0.5

PLAIN_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
#: Llama 3's way: each message's content trimmed of surrounding whitespace.
TRIM_TEMPLATE = PLAIN_TEMPLATE.replace(
    "{{ message['content'] }}", "{{ message['content'] | trim }}"
)

_SYLLABLES = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"] + ["th", "ch", "st", "qu"]
_PUNCTUATION = [".", ",", "!", "?", ";", ":"]


def folder_name() -> str:
    """The model folder's name: the model and the recipe."""
    return f"{MODEL_NAME}-r{RECIPE}"


def corpus(seed: int = SEED, lines: int = 6000) -> list[str]:
    """The tokenizer's training text: made-up words of one to three syllables drawn with a
    skewed frequency (so that common words become single tokens), numbers and punctuation,
    spaces, newlines and a little indentation; only printable ASCII."""
    rng = random.Random(seed)
    words = sorted(
        {"".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(3000)}
    )
    cumulative = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    out = []
    for _ in range(lines):
        parts = []
        for _ in range(rng.randint(3, 14)):
            roll = rng.random()
            if roll < 0.05:
                parts.append(str(rng.randint(0, 2000)))
            else:
                word = rng.choices(words, cum_weights=cumulative)[0]
                parts.append(word.capitalize() if roll > 0.9 else word)
            if rng.random() < 0.1:
                parts[-1] += rng.choice(_PUNCTUATION)
        indent = "  " * rng.choice([0, 0, 0, 1, 2])
        out.append(indent + " ".join(parts) + rng.choice([".", "\n", "\n\n", " "]))
    return out


def _tokenizer(seed: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer)
    bos_id = tok.token_to_id(BOS)
    # As Llama 3's: a text prompt gets BOS in front (vLLM's completions route adds special tokens).
    tok.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
            ),
        ]
    )
    return tok


def _silent_ids(tok: Any) -> list[int]:
    """Tokens a generation must not emit: special ones (bar :data:`EMITTED_SPECIAL`) and those
    whose text is not printable ASCII or whitespace."""
    silent = []
    for token, token_id in tok.get_vocab().items():
        if token in SPECIAL_TOKENS:
            if token != EMITTED_SPECIAL:
                silent.append(token_id)
            continue
        text = tok.decode([token_id])
        printable = all(ch.isprintable() or ch in "\n\t" for ch in text)
        if not (text and text.isascii() and printable):
            silent.append(token_id)
    return sorted(silent)


def _weights(vocab: int, silent: list[int], emitted: int, seed: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(seed)

    def normal(rows: int, cols: int, std: float) -> Any:
        return (rng.standard_normal((rows, cols)) * std).astype(np.float32)

    proj = 1.0 / np.sqrt(HIDDEN)
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab, HIDDEN, 1.0)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        for name in ("q_proj", "k_proj", "v_proj"):
            tensors[p + f"self_attn.{name}.weight"] = normal(HEADS * HEAD_DIM, HIDDEN, proj)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM, proj)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN, proj)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN, proj)
        tensors[p + "mlp.down_proj.weight"] = normal(
            HIDDEN, INTERMEDIATE, 1.0 / np.sqrt(INTERMEDIATE)
        )
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    head = normal(vocab, HIDDEN, LOGIT_WEIGHT_STD)
    head[silent] = 0.0
    head[emitted] *= EMITTED_SPECIAL_SCALE
    tensors["lm_head.weight"] = head
    return tensors


def _config(vocab: int, bos_id: int, eos_ids: list[int]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_ids,
        "torch_dtype": "float32",
    }


def build(out: str | os.PathLike[str], *, seed: int = SEED) -> Path:
    """Write the model folder to ``out`` (created; files in it are replaced) and return it.

    Needs numpy, safetensors and tokenizers (the vLLM virtualenv has them). Takes a few
    seconds, most of it training the tokenizer."""
    from safetensors.numpy import save_file

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(seed)
    tok.save(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    bos_id = tok.token_to_id(BOS)
    eos_ids = [tok.token_to_id(EOT), tok.token_to_id(EOS)]
    emitted = tok.token_to_id(EMITTED_SPECIAL)
    save_file(
        _weights(vocab, _silent_ids(tok), emitted, seed),
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_text(json.dumps(_config(vocab, bos_id, eos_ids), indent=2))
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_ids}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": PLAIN_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOT}, indent=2)
    )
    (folder / "plain_template.jinja").write_text(PLAIN_TEMPLATE)
    (folder / "trim_template.jinja").write_text(TRIM_TEMPLATE)
    return folder


def ensure_built(models_dir: str | os.PathLike[str], python: str) -> Path:
    """The model folder under ``models_dir``, built by ``python`` (the vLLM virtualenv's) when
    it is not there yet. Built in a temporary folder beside it and renamed into place, so a
    folder that exists is whole, and two processes building at once both end with it."""
    parent = Path(models_dir)
    folder = parent / folder_name()
    if (folder / "config.json").exists():
        return folder
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=parent))
    try:
        subprocess.run(
            [python, __file__, str(tmp)],
            check=True,
            capture_output=True,
            timeout=300,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
        try:
            tmp.rename(folder)
        except OSError:
            if not (folder / "config.json").exists():
                raise
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"building the tiny model failed:\n{exc.stderr.decode()}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


if __name__ == "__main__":
    build(sys.argv[1])
