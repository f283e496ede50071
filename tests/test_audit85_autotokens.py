"""Audit 85 of ``auto_tokens``: models it took for image or text models although it cannot pick
their tokens. Video models (5-D ``pixel_values``), audio models with a ``Conv2d`` (a
spectrogram) and models fed images already cut into patches got ``Patches``, which the
measurement then refused (for a spectrogram with advice the model cannot take); speech
encoder–decoders, whose encoder has no token embedding, were refused as sharing a word embedding
with their decoder, with a fix that left them refused. Random-init models from small configs
(offline)."""

from __future__ import annotations

import pytest
import torch
from hf_blocks import has, seeded

transformers = pytest.importorskip("transformers")

from senslab import auto_tokens  # noqa: E402
from senslab.measure import token_sensitivity  # noqa: E402
from senslab.tokens import Embedding, Patches  # noqa: E402

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             num_labels=3)


# -- inputs that are no (batch, channels, height, width) images -------------------------------

@pytest.mark.filterwarnings("ignore:the standard error rests on no flip")
def test_a_video_model_is_refused_naming_its_embeddings_block():
    """VideoMAE takes (batch, frames, channels, height, width): auto_tokens gave Patches(16),
    which the measurement refused. Refused now, naming the Embedding that measures it."""
    has("VideoMAEForVideoClassification")
    model = seeded(lambda: transformers.VideoMAEForVideoClassification(transformers.VideoMAEConfig(
        **SMALL, image_size=32, num_frames=4, tubelet_size=2)))
    with pytest.raises(TypeError, match=r"videos, \(batch, frames.*"
                                        r"Embedding\('videomae\.embeddings'\)"):
        auto_tokens(model)
    with pytest.raises(TypeError, match="videos"):  # the user's patch size cannot cut them
        auto_tokens(model, patch_size=16)
    # the tokens named measure it
    batch = {"pixel_values": torch.randn(2, 4, 3, 32, 32, generator=torch.Generator()
                                         .manual_seed(0))}
    r = token_sensitivity(model, batch, Embedding("videomae.embeddings"), sigma=0.1, generator=0)
    assert r.num_forward > 2


def test_a_spectrogram_model_is_refused_not_cut_as_a_grayscale_image():
    """AST takes a (batch, time, frequency) spectrogram through a Conv2d: auto_tokens gave
    Patches(16), and the measurement's advice (add a channel axis) gave an input the model
    cannot take."""
    has("ASTForAudioClassification")
    model = seeded(lambda: transformers.ASTForAudioClassification(transformers.ASTConfig(
        **SMALL, max_length=32, num_mel_bins=32)))
    with pytest.raises(TypeError, match=r"audio \('input_values'.*"
                                        r"Embedding\('audio_spectrogram_transformer\.embeddings'\)"):
        auto_tokens(model)


def test_a_model_fed_patches_already_cut_is_refused():
    """SigLIP 2 takes (batch, patches, channels·p·p) with its spatial_shapes: auto_tokens gave
    Patches(16) (the CNN default: no convolution), which cannot cut them."""
    has("Siglip2ForImageClassification")
    vision = transformers.Siglip2VisionConfig(hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=1, num_attention_heads=2,
                                              num_patches=16, patch_size=4)
    model = seeded(lambda: transformers.Siglip2ForImageClassification(transformers.Siglip2Config(
        vision_config=vision.to_dict(), num_labels=3)))
    with pytest.raises(TypeError, match=r"already cut into patches.*"
                                        r"Embedding\('vision_model\.embeddings'\)"):
        auto_tokens(model)


def test_image_models_keep_their_patches():
    """The rules for (batch, channels, height, width) images stay: a ViT's patch size, and a
    Perceiver image classifier (whose config has a num_frames for its multimodal models) the
    CNN default."""
    vit = seeded(lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        **SMALL, image_size=32, patch_size=8)))
    assert auto_tokens(vit) == Patches(8)
    has("PerceiverForImageClassificationLearned")
    perceiver = seeded(lambda: transformers.PerceiverForImageClassificationLearned(
        transformers.PerceiverConfig(d_model=32, d_latents=32, num_latents=8,
                                     num_self_attends_per_block=1, num_self_attention_heads=2,
                                     num_cross_attention_heads=1, image_size=16, num_labels=3)))
    assert auto_tokens(perceiver).size == 16


# -- a word embedding that is the decoder's alone ---------------------------------------------

def speech2text():
    has("Speech2TextForConditionalGeneration")
    return seeded(lambda: transformers.Speech2TextForConditionalGeneration(
        transformers.Speech2TextConfig(
            vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
            decoder_ffn_dim=64, input_feat_per_channel=16, conv_channels=32,
            max_source_positions=64, max_target_positions=64)))


@pytest.mark.parametrize("embedding", ["block", "word"])
def test_a_speech_encoder_decoder_is_refused_as_having_no_input_tokens(embedding):
    """Speech2Text's encoder takes audio features; get_input_embeddings() is the decoder's
    embed_tokens. Refused as adding its positions inline (naming embedding='word'), and with
    embedding='word' as sharing it with the encoder, whose fix left it refused: now said for
    what it is, the decoder's embedding."""
    model = speech2text()
    with pytest.raises(TypeError, match=r"\(model\.decoder\.embed_tokens\) is its decoder's: its "
                                        r"encoder \(model\.encoder\) takes 'input_features'"):
        auto_tokens(model, embedding=embedding)


def test_a_speech_encoder_decoder_model_is_not_said_to_share_its_embedding():
    """SpeechEncoderDecoderModel (wav2vec2 → BERT): refused as sharing the decoder's
    LayerNorm with the encoder, which holds no such module."""
    has("SpeechEncoderDecoderModel")
    encoder = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16)
    decoder = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, intermediate_size=64,
                                      is_decoder=True, add_cross_attention=True)
    model = seeded(lambda: transformers.SpeechEncoderDecoderModel(
        transformers.SpeechEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)))
    with pytest.raises(TypeError, match=r"is its decoder's") as info:
        auto_tokens(model)
    assert "share" not in str(info.value)


def test_text_encoder_decoders_keep_their_encoder_tokens():
    """An encoder with its own token embedding is untouched: BART's encoder LayerNorm."""
    model = seeded(lambda: transformers.BartForSequenceClassification(transformers.BartConfig(
        vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, num_labels=3)))
    assert auto_tokens(model).module == "model.encoder.layernorm_embedding"
