"""Small helpers for the text that runs print: counts with their nouns."""


def plural(count, word, plural_word=None):
    """``count`` and ``word``, the noun in the plural unless the count is one.

    ``plural(1, "replica")`` -> ``"1 replica"``; ``plural(4, "replica")`` -> ``"4 replicas"``;
    ``plural(2, "batch", "batches")`` -> ``"2 batches"``. ``plural_word`` defaults to ``word``
    with an ``s``.
    """
    return f"{count} {word if count == 1 else plural_word or word + 's'}"
