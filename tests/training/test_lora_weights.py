"""LoRA and the weight stream on one process: merged weights equal PEFT's merge; bad LoRA configs name their key."""

from __future__ import annotations

import pytest
import torch

from agentenv.configs import LoraConfig, config_from_dict
from agentenv.errors import ConfigError
from agentenv.training import sharding


def test_full_weights_merge_lora_like_peft(tiny_model_path):
    from transformers import AutoModelForCausalLM

    model = sharding.add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_path), LoraConfig(r=4, alpha=8.0))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)  # only the adapters train
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(std=0.05)  # B starts at 0: make the adapters change something
    streamed = dict(sharding.full_weights(model))
    reference = model.merge_and_unload().state_dict()
    # plain transformers names, the tied lm_head sent once (as the embedding), nothing else missing
    assert set(streamed) == set(reference) - {"lm_head.weight"}
    for name, t in streamed.items():
        torch.testing.assert_close(t, reference[name], atol=1e-6, rtol=0)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path).state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(streamed[q], base[q])


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.strategy=zero3", "trainer.strategy"),
        ("model.lora.r=-1", "model.lora.r"),
        ("model.lora.dropout=1.0", "model.lora.dropout"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
    ],
)
def test_bad_sharding_configs_name_their_key(override, key):
    with pytest.raises(ConfigError) as e:
        config_from_dict({}, ["model.lora.r=4", override] if "target" in override else [override])
    assert e.value.key == key


def test_unknown_lora_target_names_the_key(tiny_model_path):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ConfigError) as e:
        sharding.add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_path), LoraConfig(r=4, target_modules=("qkv",)))
    assert e.value.key == "model.lora.target_modules"
