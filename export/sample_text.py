"""A little English text the export validates with (and the tests train their tiny tokenizers on)."""

SENTENCES: tuple[str, ...] = (
    "A gorgeous, witty, seductive movie that never loses its nerve.",
    "The plot is thin and the jokes fall flat long before the end.",
    "EU rejects German call to boycott British lamb.",
    "Peter Blackburn and Maria Lopez met in Brussels on Tuesday to discuss the Lisbon treaty.",
    "Apple Inc. opened a new office in São Paulo, Brazil, hiring 1,200 engineers.",
    "It's not a bad film -- it's just one you've seen a hundred times before.",
    "The European Commission said on Thursday it disagreed with German advice to consumers.",
    "Nadim Ladki scored twice as Japan beat Syria 2-1 in the Asian Cup in Al-Ain.",
    "Don't waste your money: the sequel is louder, longer and dumber.",
    "Her performance is quietly devastating, and the final scene will stay with you for days.",
    "The river Thames flows through London before it reaches the North Sea.",
    "Marie Curie was the first person to win Nobel prizes in two different sciences.",
)

QUESTIONS: tuple[str, ...] = (
    "Who met in Brussels?",
    "Where did Apple open a new office?",
    "Which river flows through London?",
    "What did Marie Curie win?",
)

CONTEXT: str = " ".join(SENTENCES)
