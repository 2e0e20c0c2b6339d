"""The built-in calibration text: general English across registers, written for this project.

Static int8 fixes every activation's quantization range at export, from what the model computes on this text
(or on the user's own, with --calibration). It mixes news, reviews, dialogue, instructions, science, sport and
finance, names and numbers, short and long sentences, so the ranges cover what a served model will meet.
"""

from __future__ import annotations

SENTENCES: tuple[str, ...] = (
    "The city council voted on Tuesday to extend the night bus service until two in the morning.",
    "I honestly did not expect to enjoy this film as much as I did.",
    "Heavy rain is expected across the north of the country over the weekend.",
    "Please remove the battery before cleaning the device with a damp cloth.",
    "Shares of the airline fell 4.5 percent after it cut its profit forecast for the year.",
    "Dr. Amara Okafor, a chemist at the University of Lagos, leads the research team.",
    "The service was slow, the soup was cold and nobody apologised.",
    "What time does the last train to Edinburgh leave on Sundays?",
    "Photosynthesis converts light energy into chemical energy stored in sugar.",
    "Barcelona beat Sevilla 3-1 at the Camp Nou, with two late goals from the substitutes.",
    "She poured the tea, sat down by the window and waited for the letter to arrive.",
    "An absolute masterpiece: funny, moving and beautifully shot.",
    "The committee in Geneva will publish its final report in March 2025.",
    "Add two cups of flour, a pinch of salt and stir until the dough is smooth.",
    "Mount Kilimanjaro, in Tanzania, is the highest mountain in Africa.",
    "This is easily the worst phone I have owned; the screen cracked within a week.",
    "The prime minister met the presidents of Chile and Argentina in Santiago.",
    "Could you send me the invoice by Friday, so that we can close the accounts?",
    "Water boils at 100 degrees Celsius at sea level, but at a lower temperature in the mountains.",
    "After three hours of negotiation, the union accepted a pay rise of six percent.",
    "It was fine, I suppose, though the second half dragged on far too long.",
    "Samsung and Sony both unveiled new televisions at the trade fair in Las Vegas.",
    "The old lighthouse on the cliff has guided ships along this coast since 1872.",
    "He said he would call back, but he never did.",
    "Vaccines train the immune system to recognise a virus without causing the disease.",
    "The Tokyo Stock Exchange closed higher, led by gains in technology shares.",
    "My grandmother grew up in a small village near Kraków before moving to Chicago.",
    "Nothing about this hotel matched the photographs on its website.",
    "The bridge will be closed to traffic for repairs from June until the end of August.",
    "Serena Williams won her first Grand Slam title at the US Open in 1999.",
    "If the error persists, restart the router and check that the cable is firmly connected.",
    "The novel follows two sisters who inherit a failing vineyard in southern France.",
    "Inflation in the euro zone slowed to 2.4 percent in November, official figures showed.",
    "We walked along the river for hours, talking about everything and nothing.",
    "A brave, intelligent and unexpectedly tender piece of work.",
    "The United Nations called for an immediate ceasefire and for aid to reach civilians.",
    "Bees communicate the location of flowers to each other through a kind of dance.",
    "Microsoft agreed to buy the game developer for about 69 billion dollars.",
    "The instructions were confusing and two of the screws were missing from the box.",
    "Neil Armstrong and Buzz Aldrin landed on the Moon in July 1969.",
    "Why did the meeting start without the people from the Paris office?",
    "The recipe calls for fresh basil, but dried oregano works almost as well.",
    "Police in Melbourne arrested two men after a robbery at a jewellery shop.",
    "I can't recommend it enough; the cast is superb and the ending is perfect.",
    "Global temperatures have risen by about 1.1 degrees since the late nineteenth century.",
    "The museum's new wing, designed by Zaha Hadid Architects, opens next spring.",
    "Honestly, the whole thing felt like a long advertisement for the sponsor.",
    "The Amazon river carries more water than any other river in the world.",
    "Our flight from Dubai to Singapore was delayed by almost four hours.",
    "The court ruled that the company had broken competition law in Germany and Italy.",
    "Keep the medicine out of the reach of children and store it below 25 degrees.",
    "LeBron James scored 38 points as the Lakers beat the Celtics in Boston.",
    "A thin plot, wooden acting and a soundtrack that never stops.",
    "The library lends books, films and even tools to anyone with a card.",
    "Researchers at the Max Planck Institute in Munich published the results in Nature.",
    "Turn left at the church, then take the second road on the right.",
    "The quarterly report showed revenue of $4.2 billion, up 12% from a year earlier.",
    "Everyone laughed, except the man in the grey coat at the back of the room.",
    "Kenya's Eliud Kipchoge ran the marathon in under two hours in Vienna.",
    "The software update fixes a bug that drained the battery overnight.",
)

QUESTIONS: tuple[str, ...] = (
    "When did the council vote?",
    "Who leads the research team?",
    "Which team won the match?",
    "What does photosynthesis convert light energy into?",
    "How much did the airline's shares fall?",
    "Where is Mount Kilimanjaro?",
    "What did Microsoft agree to buy?",
    "Who landed on the Moon in 1969?",
)


def paragraphs(size: int = 6) -> list[str]:
    """The sentences in consecutive groups: contexts for question answering, and long inputs for the others."""
    return [" ".join(SENTENCES[i : i + size]) for i in range(0, len(SENTENCES), size)]


def builtin_texts(task: str) -> list[tuple[str, str | None]]:
    """Calibration inputs for a task: each sentence, plus paragraphs; QA pairs each question with every paragraph."""
    if task == "qa":
        return [(question, paragraph) for question in QUESTIONS for paragraph in paragraphs()]
    longer = paragraphs(3) + paragraphs(12)
    return [(text, None) for text in (*SENTENCES, *longer)]
