"""A tiny vision-language model with random weights, generated once for the tests and the demo.

No small vision model ships in a PyPI package, and no weights come from a hub. So this builds
one from a config: an Idefics3 model (``Idefics3ForConditionalGeneration``, which vLLM serves on
CPU and whose image processor needs PIL only, no torchvision) with

* a vision tower of 2 layers, 64x64-pixel input in 8-pixel patches (64 patches), folded by a
  pixel shuffle of 2 into 16 image tokens;
* a 2-layer Llama text model on SmolLM2's tokenizer, with Idefics3's image tokens added;
* SmolLM2's ChatML chat template, taking list content (``text`` and ``image`` parts).

Every image is resized to 64x64 and costs 19 prompt tokens (16 ``<image>``, two
``<fake_token_around_image>``, one ``<global-img>``). The weights are seeded: two builds are
byte-identical. The answers are meaningless; the path — image decoding, the processor, the image
tokens counted in ``usage.prompt_tokens`` — is vLLM's real one.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

RECIPE = "idefics3-r1"
"""Bump when the recipe changes: the generated folder is named after it."""
SEED = 0
IMAGE_SIZE = 64
PATCH_SIZE = 8
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
"""``<image>`` tokens per image (16)."""
IMAGE_PROMPT_TOKENS = IMAGE_SEQ_LEN + 3
"""Prompt tokens one image adds: its ``<image>`` tokens, two fake tokens around them and
``<global-img>``."""
SPECIAL_TOKENS = [
    "<fake_token_around_image>",
    "<image>",
    "<end_of_utterance>",
    "<global-img>",
    *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7)),
]
"""Idefics3's tokens, each one token (the tile tags are unused: images are not split)."""
SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ['image', 'image_url'] %}{{ '<image>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build(tokenizer_dir: Path, out: Path) -> None:
    """Write the model folder (config, safetensors, tokenizer, processor, chat template) to
    ``out``, with the tokenizer of the SmolLM2 folder ``tokenizer_dir``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch: Any = importlib.import_module("torch")
    tf: Any = importlib.import_module("transformers")
    pil_processor: Any = importlib.import_module(
        "transformers.models.idefics3.image_processing_pil_idefics3"
    ).Idefics3ImageProcessorPil

    torch.manual_seed(SEED)
    tokenizer = tf.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.chat_template = CHAT_TEMPLATE
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    text = tf.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        **ids,
    )
    vision = tf.Idefics3VisionConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
    )
    config = tf.Idefics3Config(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        scale_factor=SCALE_FACTOR,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    config.dtype = "float32"
    model = tf.Idefics3ForConditionalGeneration(config).eval()
    model.generation_config.update(do_sample=True, temperature=0.2, top_p=0.9)
    edge = {"longest_edge": IMAGE_SIZE}
    processor = tf.Idefics3Processor(
        image_processor=pil_processor(do_image_splitting=False, size=edge, max_image_size=edge),
        tokenizer=tokenizer,
        image_seq_len=IMAGE_SEQ_LEN,
        chat_template=CHAT_TEMPLATE,
    )
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))


def check(folder: Path) -> None:
    """The saved processor turns a chat with one image into its image tokens (a RuntimeError
    otherwise): what the engine's processor will do."""
    tf: Any = importlib.import_module("transformers")
    image: Any = importlib.import_module("PIL.Image").new("RGB", (40, 30), (200, 30, 30))
    processor = tf.AutoProcessor.from_pretrained(str(folder))
    parts = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    prompt = processor.apply_chat_template([{"role": "user", "content": parts}])
    encoded = processor(text=prompt, images=[image], return_tensors="pt")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    found = int((encoded["input_ids"] == image_id).sum())
    if found != IMAGE_SEQ_LEN:
        raise RuntimeError(f"tiny VLM processor made {found} image tokens, not {IMAGE_SEQ_LEN}")
