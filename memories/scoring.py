"""What ``score`` means: an absolute relevance in [0, 1], a memory's own.

Every search returns ``score``, and the threshold applies to it. It is a
logistic of the memory's own signals:

    score = 1 / (1 + exp(-(SIMILARITY * similarity + COVERAGE * coverage + OFFSET)))

``similarity`` is the cosine between the query and the memory; ``coverage``
is its BM25 over the sum of the IDFs of the query's words (the share of
what was asked that it holds, 0-1, a little more for repeated words).
Semantic mode has the similarity term alone, lexical mode the coverage term
alone; each orders exactly as it did (a logistic of one signal keeps its
order). In hybrid mode the list's order also lets the five best candidates
raise the memories stored up to two places before and after them halfway
to their own z (conversation turns answer each other); that lift moves a
memory up the list and leaves its score alone.

No term depends on the other candidates, so a value means the same in any
query, namespace and mode, and a lone memory scores what it would among
others. The constants were fitted on development data only (LoCoMo's dev
conversations and SciFact's training claims, ``bench/calibration.py``):
the ratio of the two terms for ranking, the scale and offset as a logistic
regression with relevant and unrelated candidates weighted equally. So a
score reads as the chance that the memory is relevant to the query when
relevant and unrelated memories are equally common: 0.5 as likely relevant
as not, 0.9 nine to one. BENCHMARKS.md ("An absolute score") has the
distributions: a question's best relevant match scores at least 0.5 for
most questions, the best match of a question nothing in the namespace
answers for few.

The fit is the bundled model's (all-MiniLM-L6-v2). Another model's cosines
sit elsewhere, so its similarity enters relative to that model's own
similarity threshold (``Embedder.default_threshold``: 0.7 for OpenAI's
models, ``recall_default_threshold`` in a local export's config.json): a
similarity at that model's threshold counts as ``REFERENCE`` does for the
bundled model. That mapping is not measured; refit for another model with
``bench/calibration.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The bundled model's similarity threshold (embeddings.LOCAL_THRESHOLD): the
# similarities of the fit are that model's.
REFERENCE = 0.35


@dataclass(frozen=True)
class Line:
    """The linear part of a mode's score: z = similarity * s + coverage * c + offset."""

    similarity: float
    coverage: float
    offset: float

    def z(self, similarity: float, coverage: float = 0.0) -> float:
        return self.similarity * similarity + self.coverage * coverage + self.offset

    def score(self, similarity: float, coverage: float = 0.0) -> float:
        """A lone memory's score (no neighbour lifts it)."""
        return logistic(self.z(similarity, coverage))


# Fitted by bench/calibration.py on LoCoMo dev and SciFact's training claims,
# 2026-12-03 (BENCHMARKS.md, "An absolute score"). Hybrid: the ratio of the
# two terms (0.9) chosen for ranking, then scale and offset; the one-signal
# modes: scale and offset only.
HYBRID = Line(similarity=5.46, coverage=4.91, offset=-3.89)
SEMANTIC = Line(similarity=8.58, coverage=0.0, offset=-3.73)
LEXICAL = Line(similarity=0.0, coverage=5.53, offset=-1.82)
MODES = {"hybrid": HYBRID, "semantic": SEMANTIC, "lexical": LEXICAL}

# The default threshold on score (RECALL_DEFAULT_THRESHOLD overrides it): it
# drops what has less than one chance in seven of being relevant. On the
# development data it keeps 96% of the relevant candidates and cuts 33% of
# the unrelated ones (the old rule, similarity or coverage at least 0.35:
# 94% and 42%), and LoCoMo hit@5 at 0.74 (0.2 would cut the lifted
# conversation turns that answer: 0.737).
THRESHOLD = 0.15


def logistic(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z))


def line(mode: str, model_threshold: float = REFERENCE) -> Line:
    """Return ``mode``'s line for a model whose own similarity threshold is ``model_threshold``.

    The similarity term is moved so that ``model_threshold`` scores what
    ``REFERENCE`` scores for the bundled model; the bundled model's line is
    the fitted one.
    """
    fitted = MODES[mode]
    shift = fitted.similarity * (model_threshold - REFERENCE)
    return Line(fitted.similarity, fitted.coverage, fitted.offset - shift)
