"""Text statistics: the program this example optimizes."""


def word_count(text: str) -> int:
    """The number of whitespace-separated words in `text`."""
    return len(text.split(" "))
