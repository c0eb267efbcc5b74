"""attnkit as a transformers attention implementation: small random models built from configs (no download),
logits and greedy generate() against "sdpa" (Gemma 2, whose softcap SDPA does not take, against "eager"), with a
left-padded batch; and torch.compile(fullgraph=True) of a model's forward. Skipped without torch/transformers."""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import attnkit.integrations.transformers as ak_hf  # noqa: E402

ak_hf.register()

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, eos_token_id=None,
              bos_token_id=None)


def _config(family):
    if family == "llama":
        return transformers.LlamaConfig(**COMMON)
    if family == "qwen2":
        return transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=5, max_window_layers=1,
                                        layer_types=["full_attention", "sliding_attention"])
    if family == "gemma2":
        return transformers.Gemma2Config(**COMMON, head_dim=16, sliding_window=5, attn_logit_softcapping=30.0,
                                         final_logit_softcapping=20.0, query_pre_attn_scalar=16)
    raise ValueError(family)


PEER = {"llama": "sdpa", "qwen2": "sdpa", "gemma2": "eager"}


def _models(family):
    torch.manual_seed(0)  # one config each: from_config writes the implementation into the config it is given
    ours = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation="attnkit").eval()
    peer = transformers.AutoModelForCausalLM.from_config(_config(family), attn_implementation=PEER[family]).eval()
    peer.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "attnkit" and peer.config._attn_implementation == PEER[family]
    return ours, peer


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, :9] = 0
    ids[mask == 0] = 0
    return ids, mask


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
def test_logits_and_greedy_generate_match(family, monkeypatch):
    ours, peer = _models(family)
    ids, mask = _batch()
    calls = []
    real = ak_hf.attnkit.attention
    monkeypatch.setattr(ak_hf.attnkit, "attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        a = ours(input_ids=ids, attention_mask=mask).logits
        assert len(calls) == 2  # one per layer: the model really ran attnkit
        b = peer(input_ids=ids, attention_mask=mask).logits
        assert len(calls) == 2
    visible = mask.bool()
    err = (a - b)[visible].abs().max().item()
    assert err <= 1e-4 * max(b[visible].abs().max().item(), 1.0), err
    assert torch.isfinite(a[visible]).all()
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(**kw), peer.generate(**kw))


def test_compile_fullgraph_of_the_model():
    ours, _ = _models("llama")
    ids, mask = _batch()
    with torch.no_grad():
        want = ours(input_ids=ids, attention_mask=mask).logits
        compiled = torch.compile(ours, fullgraph=True)
        got = compiled(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)


def test_training_mode_is_refused_clearly():
    ours, _ = _models("llama")
    ids, mask = _batch()
    with pytest.raises(RuntimeError, match="requires grad, but attnkit has no backward"):
        ours(input_ids=ids, attention_mask=mask)
