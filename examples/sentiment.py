"""Functions for examples/plans/sentiment.json: a word-list sentiment scorer and a reply per sentiment.

Stand-ins for real tools (an LLM call, a classifier): each is called with one state's values, many
states at a time, by the `python` node type.
"""

from __future__ import annotations

import re

POSITIVE = {"wonderful", "great", "love", "excellent", "good", "happy"}
NEGATIVE = {"terrible", "awful", "hate", "bad", "broken", "sad"}


def analyze(text: str) -> str:
    """'positive', 'negative' or 'neutral': which word list the text has more words of."""
    words = re.findall(r"[a-z']+", text.lower())
    score = sum(w in POSITIVE for w in words) - sum(w in NEGATIVE for w in words)
    return "positive" if score > 0 else "negative" if score < 0 else "neutral"


def reply(sentiment: str, text: str) -> str:
    """A canned reply for a sentiment, quoting the text."""
    opening = {"positive": "Glad to hear it", "negative": "Sorry about that", "neutral": "Thanks"}[sentiment]
    return f"{opening}: {text!r}"


def count_words(text: str) -> int:
    """How many words the text has (a third, independent check for examples/parallel_review.json)."""
    return len(re.findall(r"[a-z']+", text.lower()))
