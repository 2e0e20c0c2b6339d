"""The built-in payload set: texts written for these load tests (not taken from any data set).

Lengths follow the shapes of the real sets they stand in for: review sentences from a few words to about fifty
(SST-2 sentences average about twenty words), news sentences with names of people, organisations and places
(CoNLL-2003 style, five to forty words), and QA paragraphs of 50 to 200 words with questions answered in them
(SQuAD style).
"""

from __future__ import annotations

# Movie-review sentences for classification: short, medium and long, positive, negative and mixed.
REVIEWS: tuple[str, ...] = (
    "a small miracle.",
    "dull, dull, dull.",
    "worth every minute.",
    "the pacing drags badly.",
    "an utterly charming piece of work.",
    "it never finds its footing.",
    "the cast is uniformly excellent and clearly having fun.",
    "a clumsy script sinks what could have been a sharp satire.",
    "i laughed harder than i have at any comedy this year.",
    "the second half loses the thread and never picks it back up.",
    "quietly devastating, with a final scene that stays with you for days.",
    "more of a slide show than a movie, and a tired one at that.",
    "the director trusts the audience to keep up, and the trust is rewarded.",
    "it is the kind of film that mistakes loudness for energy and length for depth.",
    "warm, funny and surprisingly sad, often in the same scene.",
    "the dialogue sounds like it was written by committee and read off cue cards.",
    "a handsome production undone by a lead performance that never comes alive.",
    "if you can get past the first twenty minutes, there is a lovely film hiding in here.",
    "every frame looks expensive, and almost none of it means anything.",
    "the score swells at all the right moments, which is exactly the problem: it tells you what to feel.",
    "an old-fashioned adventure, made with real affection for the genre and its audience.",
    "the jokes land often enough that the weaker stretches hardly matter.",
    "by the time the twist arrives you have long since stopped caring who did what to whom.",
    "she gives the role a fierce intelligence that the script itself rarely earns.",
    "the film is too polite to be angry and too angry to be much fun, so it settles for being neither.",
    "a sly, patient character study that builds to something genuinely moving without ever raising its voice.",
    "what begins as a promising thriller slowly turns into a lecture, and a repetitive one.",
    "the animation is gorgeous, the songs are forgettable, and the kids in the audience did not seem to mind.",
    "it is hard to remember the last time a sequel improved on the original in so many ways at once.",
    "long, loud and strangely weightless, the movie feels like watching someone else play a video game.",
    "even at its most predictable, the film has a generosity toward its characters that is hard to resist.",
    "the documentary asks the right questions and then, frustratingly, refuses to wait for the answers.",
    "there are moments of real beauty here, but they are buried under a plot that keeps inventing new "
    "obstacles just to fill the running time.",
    "a wry, unhurried comedy about two brothers who cannot stand each other and cannot stay apart, anchored "
    "by performances so natural you forget anyone is acting.",
    "the film wants to be a sweeping family saga, a courtroom drama and a ghost story, and it ends up being "
    "a little of each and not enough of any.",
    "for all its flaws, this is a movie made by people who care about the craft, and it shows in the "
    "lighting, the editing and the way every minor character gets at least one moment to shine.",
    "after a brilliant opening sequence that promises a tense, clever heist picture, the story collapses into "
    "a series of chases, each less interesting than the last, until the ending arrives more as relief than "
    "as payoff.",
    "it opens as a gentle comedy about a retired teacher who takes up competitive baking, wanders into a "
    "half-hearted romance, detours through a subplot about a failing bakery and a greedy landlord, and by the "
    "end has become a tearful meditation on grief that it has not earned and does not seem to understand.",
    "not a great film, but a good and honest one.",
    "terrible.",
    "an instant favourite.",
)

# News-style sentences for NER: people, organisations, places and miscellaneous names (invented or common).
NEWS: tuple[str, ...] = (
    "Maria Lopez scored twice as Valencia beat Sevilla 3-1 on Sunday.",
    "The European Commission said on Tuesday it would review the merger.",
    "Shares in Nordwind Energy fell 4 percent in Frankfurt after the profit warning.",
    "Kenya's Daniel Kiptoo won the Boston Marathon in two hours and seven minutes.",
    "Prime Minister Anna Berg will visit Tokyo and Seoul next month, her office said.",
    "Rain stopped play in Manchester.",
    "The United Nations refugee agency appealed for more funds for camps in northern Uganda.",
    "Police in Lyon arrested two men in connection with the robbery, a spokesman told Reuters.",
    "Chelsea signed the Brazilian defender Paulo Mendes on a four-year contract.",
    "Toyota and Honda both raised their forecasts for the year to March.",
    "The Australian dollar edged higher against the yen in Sydney trading.",
    "Thomas Keller, chief executive of Alpine Bank, resigned on Friday.",
    "Talks between Israel and Syria resumed in Washington under American mediation.",
    "The World Health Organisation confirmed new cases of cholera in Angola and Zambia.",
    "Italian prosecutors opened an inquiry into the collapse of the bridge near Genoa.",
    "Serena Okafor beat Lina Petrova 6-3 6-4 to reach the final of the Qatar Open in Doha.",
    "The Bundesbank left its key rates unchanged, as most analysts had expected.",
    "Fighting flared again around Kabul overnight, witnesses said.",
    "Microsoft said it would open a research centre in Cambridge employing 200 people.",
    "Results of English Premier League matches on Saturday.",
    "The Dutch government plans to sell its remaining stake in KPN before the end of the year, Finance Minister "
    "Jan de Vries told parliament in The Hague.",
    "Ahmed Rashid, a senior official in Egypt's foreign ministry, said Cairo would host the next round of talks "
    "between the two sides.",
    "Brazil's central bank cut its benchmark rate for the third time this year, citing slowing inflation in "
    "Sao Paulo and Rio de Janeiro.",
    "New Zealand captain Tom Harris said his side had been outplayed by South Africa in every part of the game "
    "and would need to improve before the tour moves on to Cape Town.",
    "Oil prices rose in London on Monday after OPEC ministers meeting in Vienna signalled they would keep output "
    "steady, while traders in New York waited for fresh data from the Energy Department.",
    "Swiss drugmaker Helvetica Pharma agreed to buy the American biotech company Genova Labs for 2.1 billion "
    "dollars, the companies said in a joint statement from Basel and Boston.",
    "GOLF - ANDERSSON LEADS BY ONE IN MADRID.",
    "Ireland and Scotland drew 12-12 at Lansdowne Road.",
    "The French Open organisers said Roland Garros would add a retractable roof by next season.",
    "Indian batsman Ravi Menon hit an unbeaten century as Mumbai reached 312 for four at the close.",
)

# SQuAD-style paragraphs, each with questions whose answers appear in it.
PARAGRAPHS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "The Harbour Bridge opened in 1932 after eight years of construction. Its steel arch spans 503 metres and "
        "carries rail, vehicle, bicycle and pedestrian traffic between the city centre and the northern shore. "
        "About 1,400 workers were employed on the project, and the bridge was painted with some 270,000 litres "
        "of grey paint. Today it carries more than 160,000 vehicles a day.",
        ("When did the Harbour Bridge open?", "How long is the steel arch?", "How many workers built the bridge?"),
    ),
    (
        "Photosynthesis is the process by which green plants turn light energy into chemical energy. It takes "
        "place mainly in the chloroplasts of leaf cells, where the pigment chlorophyll absorbs red and blue light. "
        "Water taken up by the roots is split, releasing oxygen, while carbon dioxide from the air is fixed into "
        "sugars in a cycle of reactions named after the chemist Melvin Calvin.",
        ("Where does photosynthesis mainly take place?", "What pigment absorbs the light?", "What gas is released?"),
    ),
    (
        "The university library was founded in 1602 with a gift of about 2,000 books from a local merchant. It "
        "moved to its present building, designed by the architect Clara Hensley, in 1898. The collection now "
        "holds more than eleven million printed items, including a copy of every book published in the country "
        "since 1911, when a law made deposit compulsory.",
        ("Who designed the present library building?", "When was the library founded?"),
    ),
    (
        "Marathon running became popular among amateurs in the 1970s. The modern distance of 42.195 kilometres was "
        "fixed in 1921, based on the course of the 1908 London Olympics, which ran from Windsor Castle to the "
        "stadium. The fastest runners now finish in just over two hours, while most city marathons close their "
        "courses after six or seven hours.",
        ("When was the modern marathon distance fixed?", "Where did the 1908 Olympic course start?"),
    ),
    (
        "Coffee plants grow best in the tropics at altitudes between 1,000 and 2,000 metres. The two species grown "
        "commercially are arabica, which makes up about 60 percent of world production, and robusta, which is "
        "hardier and contains more caffeine. After harvest the cherries are either dried in the sun or washed to "
        "remove the pulp before the beans are roasted.",
        ("Which species contains more caffeine?", "At what altitude does coffee grow best?"),
    ),
    (
        "The city council approved the new tram line in March after a two-year consultation. The line will run "
        "for 14 kilometres from the railway station to the airport, with 19 stops, and is expected to carry 40,000 "
        "passengers a day. Construction is due to begin next spring and to cost 620 million euros, two thirds of "
        "it paid by the national government.",
        ("How long will the tram line be?", "How many stops will the line have?", "Who pays two thirds of the cost?"),
    ),
    (
        "Volcanoes form where molten rock reaches the surface of the Earth. Most lie along the edges of tectonic "
        "plates, especially around the Pacific Ocean in a belt known as the Ring of Fire. Some, such as those of "
        "Hawaii, sit far from plate boundaries above hot spots in the mantle.",
        ("Where do most volcanoes lie?", "What is the belt around the Pacific called?"),
    ),
    (
        "The orchestra gave its first concert in 1882 in a converted roller-skating rink. Its founder, the "
        "conductor Hans Richter, insisted on long rehearsals and strict discipline, which were unusual at the time. "
        "Within a decade it was touring abroad, and in 1913 it gave the premiere of a symphony that the composer "
        "had dedicated to the players themselves. The orchestra moved into its own concert hall in 1929, and its "
        "recordings from the following years are still reissued.",
        ("Who founded the orchestra?", "Where did the orchestra give its first concert?"),
    ),
    (
        "Honey bees live in colonies of up to 60,000 workers, a single queen and a few hundred drones. Workers "
        "communicate the direction and distance of food with a waggle dance performed on the comb. A strong colony "
        "can produce more than 25 kilograms of surplus honey in a good year.",
        ("How do workers communicate where food is?", "How many workers can a colony have?"),
    ),
    (
        "The company was started in a garage in 1976 by two school friends who built circuit boards for hobbyists. "
        "Its first product sold fewer than 200 units, but the second, a complete computer with a keyboard and a "
        "case, sold tens of thousands. The firm went public four years later, making both founders millionaires "
        "before they were thirty.",
        ("Where was the company started?", "When was the company started?"),
    ),
    (
        "The river rises in a marsh on the western plateau and flows for about 1,100 kilometres before reaching the "
        "sea through a wide delta. For most of its length it was navigable only by small boats until a series of "
        "locks was completed in 1874, allowing barges of up to 300 tonnes to reach the inland port of Mirden. "
        "Trade along the river peaked at the start of the twentieth century, when timber, grain and coal made up "
        "most of the cargo. The arrival of the railway in the 1890s slowly took much of that traffic away, and by "
        "1960 only a handful of commercial barges still used the locks. Since then the river has become popular "
        "with anglers and holiday boats, and the old towpath has been turned into a cycle route that runs from the "
        "delta to the foot of the plateau. A flood in 1953, the worst on record, led to the building of the "
        "embankments that now protect the towns along the lower river.",
        (
            "How long is the river?",
            "When were the locks completed?",
            "What made up most of the cargo?",
            "What led to the building of the embankments?",
        ),
    ),
    (
        "Lighthouses were once kept by resident keepers who trimmed the wicks, wound the clockwork that turned the "
        "lens and kept a log of passing ships and the weather. The work was lonely, and on rock towers far from "
        "land the keepers served in shifts of several weeks, relieved by boat when the sea allowed. From the 1920s "
        "electric lamps replaced oil, and from the 1960s automatic switching and remote monitoring made the keepers "
        "unnecessary; the last keepers in the country left their tower in 1998. Many of the old lighthouses are "
        "still in use, now powered by solar panels and batteries, while others have been turned into museums, "
        "holiday cottages or bird observatories. The lenses, some of them more than two metres tall and made of "
        "hundreds of prisms, are often the most valuable part of the building, and several have been moved to "
        "maritime museums for safe keeping. Ships today rely mainly on satellite navigation, but the lights are "
        "kept as a backup and as a landmark for small boats.",
        ("When did the last keepers leave?", "What replaced oil?", "What do ships rely on today?"),
    ),
)
