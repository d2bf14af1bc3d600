"""RefreshableTower: a refresh writes new weights into the converted graph, whose memory a tower compiled
before may still read (that older tower's vectors drifted 0.047 in a validation, 0.46 here on the tiny
BERT). Each refresh ends the towers compiled before it: using one raises, it never computes with another
step's weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.config import ModelConfig
from pipeline.errors import PipelineError
from pipeline.models import BiEncoder, backends
from pipeline.models.tokens import tokenize_sorted

pytest.importorskip("openvino")

TEXTS = [f"passage {i} about " + "dense retrieval " * (i % 7) for i in range(16)]


def _nudge(model, seed: int, scale: float = 0.05):
    """Change every weight in place, as an optimizer step does."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)


@pytest.mark.slow
def test_a_refresh_ends_the_towers_compiled_before_it(tiny_model_dir, tmp_path):
    model = BiEncoder.load(ModelConfig(name_or_path=str(tiny_model_dir), doc_max_length=64, pooling="mean",
                                       normalize=True)).eval()
    tok, prefix, max_len = model.token_spec("doc")
    toks = tokenize_sorted(tok, TEXTS, prefix, max_len)
    refreshable = backends.RefreshableTower(model, "doc", cache=tmp_path)

    def tower():
        used, runner, _, _ = backends.tower_runner(model, "doc", "openvino", "fp32", 1, keep=False,
                                                   option="validation", refreshable=refreshable)
        assert used == "openvino" and runner.check["passed"]
        return runner

    def vectors(runner=None):
        return model.embed_tokens(toks, "doc", batch_size=8, precision="fp32", runner=runner)

    first = tower()
    np.testing.assert_allclose(vectors(first), vectors(), atol=1e-5)
    _nudge(model, 1)
    second = tower()  # the graph refreshed with the new weights
    with pytest.raises(PipelineError, match="compiled before the model's converted graph was refreshed"):
        vectors(first)
    assert first.compiled is None and first.request is None  # let go, not only refused
    np.testing.assert_allclose(vectors(second), vectors(), atol=1e-5)  # the new tower: the new weights
    np.testing.assert_allclose(vectors(second), vectors(second))  # usable until the next refresh
    _nudge(model, 2)
    third = tower()
    with pytest.raises(PipelineError, match=r"refreshed with newer weights \(use 3\)"):
        second(backends.probe_batches(model, "doc")[0])
    np.testing.assert_allclose(vectors(third), vectors(), atol=1e-5)
    assert refreshable.uses == 3
