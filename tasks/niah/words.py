"""Word lists for the synthetic NIAH texts, in two disjoint vocabularies.

Why two: the calibration set (``bosch_niah_calib``) chooses the heads that the eval suite
(``bosch_niah``) then measures, so the two must share no content (paper B.4: no overlap
with RULER's NIAH test set). The calibration side is a ship's ledger with made-up
personal names as keys; the eval side mirrors RULER (``adjective-noun`` keys, an
essay-like haystack about work and ideas in place of RULER's downloaded Paul Graham
essays). ``tests/test_niah_tasks.py`` checks that the two vocabularies, and the texts
built from them, meet only in function words.

The made-up names also keep calibration keys apart from RULER's own key vocabulary
(``wonderwords`` adjectives and nouns).
"""

from __future__ import annotations

# --- eval suite (RULER-like) ------------------------------------------------------------

EVAL_KEY_ADJECTIVES = (
    "able", "active", "ancient", "angry", "brave", "bright", "broad", "busy", "calm", "careful",
    "cheap", "clean", "clever", "cold", "cool", "curious", "dark", "deep", "distant", "dry",
    "eager", "early", "easy", "empty", "equal", "exact", "fair", "famous", "fancy", "fast",
    "fierce", "fine", "flat", "fresh", "friendly", "funny", "gentle", "giant", "glad", "golden",
    "grand", "happy", "heavy", "hollow", "honest", "huge", "humble", "hungry", "jolly", "kind",
    "large", "lazy", "little", "lively", "lonely", "loud", "lucky", "mighty", "modern", "narrow",
    "neat", "noble", "odd", "pale", "plain", "polite", "proud", "quick", "quiet", "rapid",
    "rare", "rich", "rough", "round", "royal", "sharp", "shiny", "silent", "silver", "simple",
    "slow", "small", "smooth", "soft", "solid", "spicy", "steady", "strange", "strong", "sweet",
    "swift", "tall", "tender", "tidy", "tiny", "warm", "wild", "wise", "young", "zesty",
)  # fmt: skip

EVAL_KEY_NOUNS = (
    "apple", "arrow", "badge", "basket", "beacon", "bell", "blanket", "bottle", "bridge", "bucket",
    "button", "camera", "candle", "canyon", "carpet", "castle", "cellar", "chair", "cherry", "circle",
    "cloud", "coin", "comet", "cookie", "corner", "cottage", "crystal", "curtain", "desert", "diamond",
    "dragon", "drum", "eagle", "engine", "falcon", "feather", "fence", "forest", "fountain", "garden",
    "glacier", "guitar", "hammer", "helmet", "island", "jacket", "jungle", "kettle", "kitten", "ladder",
    "lemon", "library", "lizard", "magnet", "meadow", "mirror", "monkey", "mountain", "orchard", "oven",
    "owl", "palace", "panda", "parrot", "pencil", "piano", "pillow", "planet", "pocket", "puzzle",
    "rabbit", "rainbow", "river", "robot", "rocket", "scarf", "shadow", "shelf", "spider", "spoon",
    "squirrel", "statue", "stone", "tiger", "tower", "tractor", "trumpet", "tunnel", "turtle", "umbrella",
    "valley", "violin", "wagon", "wallet", "whistle", "window", "wizard", "zebra", "acorn", "bicycle",
)  # fmt: skip

# An essay-like haystack: plain sentences about work and ideas, the register of RULER's essays.
ESSAY_PEOPLE = (
    "founders", "investors", "programmers", "writers", "students", "startups", "companies", "users",
    "hackers", "teachers", "editors", "researchers", "designers", "customers", "engineers",
    "professors", "artists", "scientists", "managers", "readers",
)  # fmt: skip
ESSAY_VERBS = (
    "build", "notice", "ignore", "underestimate", "want", "admire", "copy", "discover", "explain",
    "measure", "question", "improve", "abandon", "choose", "imagine", "predict", "simplify", "test",
    "value", "write",
)  # fmt: skip
ESSAY_THINGS = (
    "new ideas", "hard problems", "good taste", "small details", "their own work", "ambitious projects",
    "simple tools", "unpopular opinions", "early versions", "honest feedback", "obvious questions",
    "boring tasks", "strange results", "difficult essays", "clever shortcuts", "practical advice",
    "general principles", "unexpected patterns", "careful arguments", "ordinary habits",
)  # fmt: skip
ESSAY_ADVERBS = (
    "rarely", "usually", "often", "seldom", "gradually", "eventually", "quietly", "deliberately",
    "naturally", "mostly",
)  # fmt: skip
ESSAY_OPENERS = (
    "In practice,", "Surprisingly,", "Of course,", "Oddly enough,", "In general,", "At first,",
    "Looking back,", "For most people,", "Sometimes,", "In the end,",
)  # fmt: skip
ESSAY_LINKS = ("because", "although", "even when", "unless", "until", "whenever", "since", "while")
ESSAY_QUALITIES = ("surprising", "important", "interesting", "hardest", "best", "worst", "tricky", "useful")

# --- calibration set (ship's ledger) ------------------------------------------------------

CALIB_GIVEN_NAMES = (
    "Aldra", "Benhir", "Corvane", "Dellis", "Emrath", "Faolan", "Gisra", "Halvek", "Ismene", "Joreth",
    "Kaelis", "Lunet", "Merrow", "Nerys", "Orvik", "Pellam", "Quenna", "Rhosyn", "Sabeth", "Tamsin",
    "Ulrik", "Vesna", "Wendol", "Ysolde", "Zoran", "Anwen", "Brisca", "Cadoc", "Dervla", "Eluned",
    "Fenwick", "Gwalchmai", "Hesketh", "Ilsabet", "Jessamy", "Kenelm", "Lowri", "Maelis", "Nesta", "Osric",
)  # fmt: skip
CALIB_FAMILY_NAMES = (
    "Venmoor", "Ashcombe", "Thornvale", "Kestrani", "Oldacre", "Brightwater", "Calloway", "Dunmere",
    "Elstrom", "Farrowdale", "Grimsteed", "Hollinrake", "Ivescombe", "Jorvalde", "Kettleby", "Lanyon",
    "Marchbank", "Nethercott", "Ormsby", "Penhallow", "Quarrington", "Rookwood", "Saltonstall",
    "Treharne", "Uttridge", "Vayle", "Wetherell", "Yardley", "Zellaby", "Abernathy",
)  # fmt: skip
CALIB_VESSELS = (
    "schooner", "brigantine", "ketch", "barque", "sloop", "galleon", "cutter", "lugger", "yawl",
    "clipper", "frigate", "caravel", "dhow", "pinnace", "collier", "hoy",
)  # fmt: skip
CALIB_PORTS = (
    "Tarvos", "Quillon", "Mereth", "Drummoch", "Kelvarre", "Saltmere", "Brannock", "Ivelund",
    "Corrabay", "Haddowe", "Lisquay", "Ostrevin", "Pellorm", "Runcastle", "Skellig", "Varnholt",
)  # fmt: skip
CALIB_CARGO = (
    "timber", "copper", "salt", "wool", "linen", "barley", "tallow", "indigo", "saffron", "pepper",
    "herring", "tin", "hemp", "rum", "molasses", "cinnamon", "flax", "tar", "oakum", "cloves",
)  # fmt: skip
CALIB_WEATHER = ("fog", "drizzle", "squall", "gale", "haze", "sleet", "rolling swell", "headwind", "downpour")
CALIB_CREW = (
    "boatswain", "quartermaster", "purser", "helmsman", "navigator", "deckhand", "surgeon", "cooper",
    "carpenter", "mate",
)  # fmt: skip
CALIB_TIMES = ("dawn", "dusk", "noon", "midnight", "the morning watch", "the dog watch")
CALIB_COUNTS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "twelve", "twenty")
# Word values ("capstan-fathom"): two of these joined by a hyphen, as RULER writes its word keys.
CALIB_CODE_WORDS = (
    "anchor", "brine", "capstan", "davit", "fathom", "gunwale", "hawser", "jib", "keel", "lanyard",
    "mizzen", "oar", "pennant", "quay", "rigging", "spar", "tiller", "windlass", "bowsprit", "bilge",
    "halyard", "scupper", "transom", "yardarm", "cleat", "grommet", "sextant", "buoy", "reef", "hull",
)  # fmt: skip
# The noise haystack: one line repeated, as RULER's "The grass is green. ..." (never its words).
CALIB_NOISE = ("The tide ebbs. The lantern burns. The hull creaks. The rope holds. Below deck the hammocks sway.",)

# --- retrieval calibration set (a botanic garden's registry) ------------------------------
# bosch_retrieval_calib: a third vocabulary, in no bundled model's training mix.

RETRIEVAL_GIVEN_NAMES = (
    "Arlet", "Bodmin", "Cressa", "Doval", "Esker", "Fennick", "Galwen", "Hobart", "Irian", "Jessel",
    "Kestle", "Lorcan", "Mabyn", "Nairn", "Odile", "Perran", "Rosken", "Sennen", "Tavish", "Veryan",
    "Wenna", "Yestin", "Zennor", "Aldous", "Bryher", "Colan", "Demelza", "Elowen", "Fyfield", "Gorran",
)  # fmt: skip
RETRIEVAL_FAMILY_NAMES = (
    "Pennywhistle", "Stonebrook", "Underhay", "Whitlock", "Greenhill", "Mossgrove", "Fairholme",
    "Larkspur", "Quillfeather", "Rushmere", "Tidewell", "Wrenfield", "Ashgrove", "Briarwood",
    "Coldharbour", "Dewhurst", "Fernleigh", "Hazelden", "Kingsmead", "Oakhurst",
)  # fmt: skip
RETRIEVAL_PLANTS = (
    "fern", "orchid", "ivy", "basil", "thyme", "sage", "lily", "tulip", "cactus", "begonia",
    "camellia", "dahlia", "fuchsia", "hosta", "lupin", "peony", "primrose", "yucca",
)  # fmt: skip
RETRIEVAL_HOUSES = ("glasshouse", "palm house", "bothy", "seed room", "potting shed", "fernery", "orangery")
RETRIEVAL_STAFF = ("gardener", "keeper", "apprentice", "botanist", "curator", "propagator", "volunteer")
RETRIEVAL_TASKS = ("watered", "pruned", "repotted", "labelled", "misted", "staked", "divided", "weeded")
