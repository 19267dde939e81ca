"""A seeded **synthetic** WebShop catalogue (not the original 1.18 M-product benchmark).

The original product and instruction files are only distributed through Google Drive,
so the default catalogue is generated: 5 WebShop categories × 8 product types, each
with its own attribute pool, option groups (size/colour/flavour/scent ...) and price
range; brands, titles, descriptions, feature bullets and reviews are composed from
word lists. Every product gets one goal in WebShop's synthetic-goal format
(``"<instruction> with <option>: <value>, and ... , and price lower than X dollars"``)
whose attributes are a subset of the product's attributes and whose options are one
of its option combinations.

The vocabulary is chosen so that the reward's fuzzy/substring matching stays
meaningful: different values of one option group never fuzzy-match each other, and
no product mentions an option value or an unowned attribute in its text (both are
checked by the tests). Generation is deterministic in ``seed`` (``random.Random``; no
set/dict-hash iteration) and takes well under a second for the default 5000 products.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

from arena_envs.webshop.catalog import Catalog, Goal, Product, Review

DEFAULT_NUM_PRODUCTS = 5000
#: Price bounds of goals are multiples of ten, as in WebShop's goal generator.
PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_BOUND = 1_000_000.0


@dataclass(frozen=True)
class _Type:
    query: str                     # WebShop's "query" field (what the product was listed under)
    title: str                     # noun phrase used in titles
    nouns: tuple[str, ...]         # product-type nouns for the type reward
    path: str                      # product_category below the category root
    attrs: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...], int, int], ...]  # (name, pool, min, max values offered)
    price: tuple[float, float]


@dataclass(frozen=True)
class _Category:
    name: str
    root: str
    attrs: tuple[str, ...]
    brands: tuple[str, ...]
    styles: tuple[str, ...]
    sentences: tuple[str, ...]
    types: tuple[_Type, ...]


def _t(query, nouns, path, attrs, options, price, title=None) -> _Type:
    return _Type(query, title or query.title(), tuple(nouns), path, tuple(attrs), tuple(options), price)


_APPAREL = ("black", "white", "grey", "navy", "blue", "green", "pink", "beige", "brown", "purple", "yellow",
            "burgundy", "olive", "khaki", "charcoal", "teal", "ivory", "red")
_HOME = ("black", "white", "grey", "walnut", "espresso", "cherry", "navy", "beige", "green")
_TECH = ("black", "white", "blue", "pink", "green", "grey", "purple", "red")
_LIPS = ("nude", "ruby", "coral", "berry", "mauve", "plum", "crimson", "peach", "fuchsia", "cinnamon")
_SCENTS = ("lavender", "coconut", "citrus", "eucalyptus", "vanilla", "unscented", "jasmine", "sandalwood")
_CLOTHES = ("x-small", "small", "medium", "large", "x-large", "xx-large")
_SHOES = ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12")
_HAIR_ML = ("8 fl oz", "12 fl oz", "16 fl oz", "33.8 fl oz")
_FACE_ML = ("1 fl oz", "1.7 fl oz", "2.5 fl oz", "3.4 fl oz")

BEAUTY = _Category(
    "beauty", "Beauty & Personal Care",
    attrs=("paraben free", "cruelty free", "long lasting", "fragrance free", "dermatologist tested", "vegan formula"),
    brands=("Lumera", "Velisse", "Aurin", "Sollena", "Kovara", "Mirabo", "Elvie", "Nuvia", "Calisto", "Opaline",
            "Seraphe", "Zenique", "Amaro", "Brisa", "Ondine", "Liora"),
    styles=("Classic", "Premium", "Everyday", "Essential", "Signature", "Pro"),
    sentences=("Suitable for daily use at home or while travelling.", "A gentle formula that leaves you feeling fresh.",
               "Packed in a recyclable container.", "Loved by customers for its pleasant texture.",
               "Apply as needed as part of your routine.", "Backed by our satisfaction guarantee."),
    types=(
        _t("shampoo", ["shampoo"], "Hair Care › Shampoo & Conditioner › Shampoos",
           ["sulfate free", "dry hair", "hair growth", "color safe", "tea tree", "anti dandruff"],
           [("size", _HAIR_ML, 2, 4), ("scent", _SCENTS, 2, 5)], (6, 38)),
        _t("conditioner", ["conditioner"], "Hair Care › Shampoo & Conditioner › Conditioners",
           ["curly hair", "leave in", "detangling", "argan oil", "frizz control", "deep conditioning"],
           [("size", _HAIR_ML, 2, 4), ("scent", _SCENTS, 2, 5)], (6, 38)),
        _t("face moisturizer", ["moisturizer"], "Skin Care › Face › Creams & Moisturizers",
           ["hyaluronic acid", "oil free", "anti aging", "fine lines", "dark spots", "spf protection"],
           [("size", _FACE_ML, 2, 4)], (9, 60)),
        _t("lipstick", ["lipstick"], "Makeup › Lips › Lipstick",
           ["matte finish", "highly pigmented", "smudge proof", "hydrating formula", "satin finish"],
           [("color", _LIPS, 3, 7)], (5, 28)),
        _t("nail polish", ["nail", "polish"], "Foot, Hand & Nail Care › Nail Art & Polish › Nail Polish",
           ["quick dry", "chip resistant", "gel effect", "non toxic", "high shine"],
           [("color", _LIPS, 3, 7)], (4, 18)),
        _t("body lotion", ["body", "lotion"], "Skin Care › Body › Lotions",
           ["shea butter", "dry skin", "fast absorbing", "non greasy", "aloe vera"],
           [("size", _HAIR_ML, 2, 4), ("scent", _SCENTS, 2, 5)], (5, 30)),
        _t("hair dryer", ["hair", "dryer"], "Hair Care › Styling Tools & Appliances › Hair Dryers",
           ["ionic technology", "low noise", "fast drying", "diffuser attachment", "cool shot button"],
           [("color", ("black", "white", "pink", "purple", "teal"), 2, 4)], (19, 120)),
        _t("makeup brush set", ["brush", "set"], "Tools & Accessories › Makeup Brushes & Tools › Brush Sets",
           ["synthetic bristles", "travel case", "foundation blending", "soft bristles", "eyeshadow brushes"],
           [("color", ("black", "white", "pink", "purple", "gold", "silver"), 2, 4)], (8, 45)),
    ))

FOOD = _Category(
    "food", "Grocery & Gourmet Food",
    attrs=("gluten free", "non gmo", "usda organic", "keto friendly", "dairy free", "kosher certified"),
    brands=("Grainfield", "Sunmeadow", "Brookvale", "Hearthly", "Pantrio", "Vitalo", "Nordelle", "Terrafare",
            "Goodhollow", "Fieldora", "Harvesta", "Plenti", "Crestmill", "Lakeby", "Wholly", "Savoro"),
    styles=("Classic", "Artisan", "Everyday", "Gourmet", "Select", "Farmhouse"),
    sentences=("A pantry favourite for busy weeks.", "Great for sharing with family and friends.",
               "Made by a team that cares about quality.", "Enjoy it at breakfast, lunch or as an afternoon snack.",
               "Packed fresh to keep every bite tasty.", "Store in a cool, dry place."),
    types=(
        _t("granola bars", ["granola", "bars"], "Snack Foods › Bars › Granola Bars",
           ["high protein", "whole grain", "nut free", "chewy texture", "no artificial flavors"],
           [("flavor", ("chocolate chip", "peanut butter", "honey oat", "blueberry", "cranberry almond",
                        "oatmeal raisin"), 2, 5), ("size", ("6 count", "12 count", "24 count", "48 count"), 2, 4)],
           (4, 32)),
        _t("ground coffee", ["coffee"], "Beverages › Coffee, Tea & Cocoa › Coffee › Ground Coffee",
           ["medium roast", "dark roast", "single origin", "fair trade", "smooth finish"],
           [("flavor", ("hazelnut", "caramel", "mocha", "french vanilla", "cinnamon"), 2, 5),
            ("size", ("12 oz", "24 oz", "32 oz", "2 lb"), 2, 4)], (7, 35)),
        _t("green tea", ["tea"], "Beverages › Coffee, Tea & Cocoa › Tea › Green Tea",
           ["caffeine free", "loose leaf", "antioxidant rich", "individually wrapped", "cold brew"],
           [("flavor", ("jasmine", "peach", "lemon ginger", "matcha", "pomegranate"), 2, 5),
            ("size", ("20 count", "50 count", "100 count"), 2, 3)], (4, 25)),
        _t("protein powder", ["protein", "powder"], "Sports Nutrition › Protein › Whey Protein",
           ["grass fed", "low carb", "muscle recovery", "easy mixing", "no artificial sweeteners"],
           [("flavor", ("vanilla", "chocolate", "strawberry", "cookies and cream", "banana", "salted caramel"), 2, 5),
            ("size", ("1 lb", "2 lb", "5 lb"), 2, 3)], (18, 75)),
        _t("beef jerky", ["beef", "jerky"], "Snack Foods › Jerky & Dried Meats › Beef Jerky",
           ["high protein", "low fat", "ready to eat", "hickory smoked", "grass fed"],
           [("flavor", ("teriyaki", "original", "peppered", "sweet and spicy", "barbecue"), 2, 5),
            ("size", ("3 oz", "8 oz", "16 oz"), 2, 3)], (6, 40)),
        _t("olive oil", ["olive", "oil"], "Pantry Staples › Cooking & Baking › Oils › Olive Oil",
           ["extra virgin", "cold pressed", "first harvest", "glass bottle", "rich aroma"],
           [("size", ("16.9 fl oz", "25.4 fl oz", "33.8 fl oz", "101 fl oz"), 2, 4)], (8, 55)),
        _t("dark chocolate", ["chocolate"], "Snack Foods › Candy & Chocolate › Chocolate Bars",
           ["fair trade", "low sugar", "individually wrapped", "single origin", "vegan friendly"],
           [("flavor", ("sea salt", "mint", "orange", "raspberry", "almond", "espresso"), 2, 5),
            ("size", ("4 count", "8 count", "12 count"), 2, 3)], (5, 36)),
        _t("pasta sauce", ["pasta", "sauce"], "Pantry Staples › Sauces › Pasta Sauces",
           ["no sugar added", "low sodium", "slow simmered", "family recipe", "vine ripened"],
           [("flavor", ("marinara", "tomato basil", "arrabbiata", "four cheese", "garlic herb"), 2, 5),
            ("size", ("24 oz", "32 oz", "45 oz"), 2, 3)], (4, 24)),
    ))

FASHION = _Category(
    "fashion", "Clothing, Shoes & Jewelry",
    attrs=("machine wash", "daily wear", "quick drying", "breathable fabric", "classic fit", "soft fabric"),
    brands=("Northway", "Urbane", "Coastline", "Stridewell", "Threadly", "Harlow", "Marlowe", "Kinsley",
            "Driftwood", "Loomis", "Vantage", "Moxie", "Ashby", "Wexley", "Solace", "Fenwick"),
    styles=("Classic", "Essential", "Everyday", "Modern", "Heritage", "Active"),
    sentences=("Designed for everyday comfort.", "Pairs easily with the rest of your wardrobe.",
               "Made with attention to detail.", "A versatile piece for work or weekend.",
               "Easy to care for and easy to wear.", "A dependable choice for any season."),
    types=(
        _t("t-shirt", ["shirt"], "Men › Clothing › Shirts › T-Shirts",
           ["short sleeve", "crew neck", "cotton jersey", "relaxed fit", "moisture wicking", "tagless collar"],
           [("color", _APPAREL, 3, 8), ("size", _CLOTHES, 3, 6)], (8, 30), title="T-Shirt"),
        _t("running shoes", ["shoes"], "Women › Shoes › Athletic › Running",
           ["rubber sole", "non slip", "breathable mesh", "arch support", "lace up", "memory foam"],
           [("color", _APPAREL, 3, 7), ("size", _SHOES, 5, 12)], (29, 120)),
        _t("jeans", ["jeans"], "Men › Clothing › Jeans",
           ["slim fit", "stretch denim", "button closure", "straight leg", "high waist"],
           [("color", ("light wash", "dark wash", "black", "indigo", "stone grey"), 2, 4),
            ("size", ("28w x 30l", "30w x 30l", "32w x 32l", "34w x 32l", "36w x 34l"), 3, 5)], (19, 80)),
        _t("hoodie", ["hoodie"], "Women › Clothing › Fashion Hoodies & Sweatshirts",
           ["drawstring hood", "kangaroo pocket", "fleece lined", "long sleeve", "zip up"],
           [("color", _APPAREL, 3, 8), ("size", _CLOTHES, 3, 6)], (15, 60)),
        _t("dress", ["dress"], "Women › Clothing › Dresses › Casual",
           ["knee length", "v neck", "floral print", "flowy skirt", "short sleeve"],
           [("color", _APPAREL, 3, 7), ("size", _CLOTHES, 3, 6)], (18, 70)),
        _t("backpack", ["backpack"], "Luggage & Travel Gear › Backpacks › Laptop Backpacks",
           ["laptop compartment", "water resistant", "padded straps", "multiple pockets", "anti theft"],
           [("color", _APPAREL, 2, 6)], (19, 90)),
        _t("socks", ["socks"], "Men › Clothing › Socks & Hosiery › Athletic Socks",
           ["cushioned sole", "moisture wicking", "ankle length", "arch compression", "seamless toe"],
           [("color", _APPAREL, 2, 5), ("size", ("small", "medium", "large", "x-large"), 2, 4)], (7, 28)),
        _t("sunglasses", ["sunglasses"], "Men › Accessories › Sunglasses & Eyewear Accessories › Sunglasses",
           ["polarized lenses", "uv protection", "metal frame", "lightweight frame", "scratch resistant"],
           [("color", ("black", "tortoise", "gold", "silver", "brown", "blue"), 2, 5)], (9, 65)),
    ))

FURNITURE = _Category(
    "furniture", "Home & Kitchen",
    attrs=("easy assembly", "living room", "space saving", "easy clean", "modern design", "sturdy construction"),
    brands=("Homely", "Oakhaven", "Nestwell", "Roomcraft", "Cozyline", "Timberly", "Casara", "Dwello",
            "Lindenhaus", "Hearthstone", "Maplewood", "Abode", "Nordhem", "Vesta", "Arbor", "Kasa"),
    styles=("Classic", "Modern", "Rustic", "Contemporary", "Minimalist", "Scandinavian"),
    sentences=("Adds a warm touch to any room.", "Instructions and hardware included.",
               "Built to last for years of use.", "A simple way to refresh your space.",
               "Designed with everyday living in mind.", "Ships in protective packaging."),
    types=(
        _t("office chair", ["chair"], "Furniture › Home Office Furniture › Home Office Desk Chairs",
           ["lumbar support", "height adjustable", "swivel base", "mesh back", "padded armrests"],
           [("color", ("black", "grey", "white", "blue", "pink"), 2, 4)], (59, 260)),
        _t("coffee table", ["table"], "Furniture › Living Room Furniture › Tables › Coffee Tables",
           ["solid wood", "storage shelf", "mid century", "lift top", "round shape"],
           [("color", _HOME, 2, 5)], (49, 240)),
        _t("bookshelf", ["bookshelf"], "Furniture › Home Office Furniture › Bookcases",
           ["open shelves", "wall mounted", "industrial style", "anti tip kit", "adjustable shelves"],
           [("color", _HOME, 2, 5)], (39, 210)),
        _t("bed sheets", ["bed", "sheets"], "Bedding › Sheets & Pillowcases › Sheet & Pillowcase Sets",
           ["deep pocket", "egyptian cotton", "cooling fabric", "wrinkle resistant", "brushed microfiber"],
           [("color", ("white", "grey", "navy", "ivory", "sage", "blush"), 2, 5),
            ("size", ("twin", "twin xl", "full", "queen", "king", "california king"), 3, 6)], (19, 110)),
        _t("throw pillow covers", ["pillow", "covers"], "Home Décor Products › Decorative Pillows, Inserts & Covers",
           ["hidden zipper", "soft velvet", "double sided", "decorative pattern", "set of two"],
           [("color", ("beige", "navy", "grey", "mustard", "emerald", "blush"), 2, 5),
            ("size", ("16 x 16 inch", "18 x 18 inch", "20 x 20 inch", "24 x 24 inch"), 2, 4)], (8, 35)),
        _t("storage ottoman", ["ottoman"], "Furniture › Living Room Furniture › Ottomans",
           ["faux leather", "foldable design", "storage space", "padded seat", "tufted top"],
           [("color", _HOME, 2, 5)], (29, 150)),
        _t("table lamp", ["lamp"], "Lighting & Ceiling Fans › Lamps & Shades › Table Lamps",
           ["touch control", "dimmable light", "fabric shade", "usb charging port", "bedside use"],
           [("color", ("black", "white", "grey", "brass", "bronze"), 2, 4)], (15, 90)),
        _t("area rug", ["rug"], "Home Décor Products › Area Rugs, Runners & Pads › Area Rugs",
           ["non shedding", "low pile", "stain resistant", "non slip backing", "plush texture"],
           [("color", ("grey", "blue", "beige", "navy", "cream", "terracotta"), 2, 5),
            ("size", ("2 x 3 ft", "3 x 5 ft", "5 x 7 ft", "8 x 10 ft"), 2, 4)], (19, 180)),
    ))

ELECTRONICS = _Category(
    "electronics", "Electronics",
    attrs=("plug and play", "easy setup", "compact design", "energy efficient", "premium build", "travel friendly"),
    brands=("Voltrix", "Sonara", "Zentek", "Aurion", "Pulsar", "Kinetiq", "Nexora", "Axion", "Lumetra",
            "Quantix", "Orbix", "Veltra", "Ampora", "Circuity", "Novalink", "Tekko"),
    styles=("Pro", "Max", "Lite", "Plus", "Ultra", "Edge"),
    sentences=("Works with most modern devices.", "Includes a user manual and a one year warranty.",
               "Built for reliable everyday performance.", "Simple to use right out of the box.",
               "Backed by friendly customer support.", "Tested to meet safety standards."),
    types=(
        _t("wireless earbuds", ["earbuds"], "Headphones, Earbuds & Accessories › Earbuds",
           ["noise cancelling", "charging case", "sweat resistant", "touch control", "long battery life"],
           [("color", _TECH, 2, 5)], (19, 150)),
        _t("bluetooth speaker", ["speaker"], "Portable Audio & Video › Portable Speakers & Docks",
           ["deep bass", "waterproof design", "stereo sound", "built in microphone", "party lights"],
           [("color", ("black", "grey", "red", "teal", "green", "orange"), 2, 5)], (19, 130)),
        _t("phone charger", ["phone", "charger"], "Cell Phones & Accessories › Chargers & Power Adapters",
           ["fast charging", "usb c", "dual port", "foldable plug", "overheat protection"],
           [("color", ("black", "white"), 2, 2), ("size", ("1 pack", "2 pack", "3 pack"), 2, 3)], (8, 35)),
        _t("hdmi cable", ["cable"], "Computers & Accessories › Cables & Interconnects › HDMI Cables",
           ["high speed", "gold plated", "braided nylon", "ultra hd", "ethernet channel"],
           [("size", ("3 ft", "6 ft", "10 ft", "15 ft", "25 ft"), 2, 5)], (5, 30), title="HDMI Cable"),
        _t("wireless mouse", ["mouse"], "Computers & Accessories › Keyboards, Mice & Accessories › Mice",
           ["ergonomic design", "silent click", "usb receiver", "rechargeable battery", "adjustable dpi"],
           [("color", _TECH, 2, 5)], (9, 60)),
        _t("mechanical keyboard", ["keyboard"], "Computers & Accessories › Keyboards, Mice & Accessories › Keyboards",
           ["hot swappable", "rgb backlit", "wireless connection", "aluminum frame", "wrist rest"],
           [("color", ("black", "white", "pink", "grey"), 2, 4), ("layout", ("full size", "tenkeyless"), 2, 2)],
           (29, 160)),
        _t("smart watch", ["watch"], "Wearable Technology › Smartwatches",
           ["heart rate monitor", "sleep tracking", "water resistant", "gps tracking", "always on display"],
           [("color", _TECH, 2, 5), ("size", ("40mm", "44mm"), 2, 2)], (29, 250)),
        _t("power bank", ["power", "bank"], "Cell Phones & Accessories › Portable Power Banks",
           ["high capacity", "led display", "slim profile", "multiple outputs", "wireless charging"],
           [("color", _TECH, 2, 4), ("size", ("10000mah", "20000mah", "26800mah"), 2, 3)], (15, 70)),
    ))

CATEGORIES = (BEAUTY, FOOD, FASHION, FURNITURE, ELECTRONICS)

_BENEFITS = ("made to meet everyday needs", "a customer favourite", "quality you can feel", "designed with care",
             "checked for quality before shipping", "a reliable choice")
_REVIEW_TITLES = ("Great value", "Just what I needed", "Works as described", "Not bad", "Could be better",
                  "Love it", "Disappointed", "Would buy again")
_REVIEW_BODIES = ("Arrived quickly and matches the description.", "Quality is fine for the price.",
                  "I have been using it for a month and I am happy with it.", "Not quite what I expected.",
                  "My whole family uses it now.", "Solid product, I would recommend it.")
_INSTRUCTIONS = ("i am looking for {a} {t}", "i need {a} {t}", "find me {a} {t}", "i want to buy {a} {t}",
                 "i'm searching for {a} {t}", "get me {a} {t}")
_ASIN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def price_upper_for(price: float, rng: random.Random) -> float:
    """WebShop's goal budget: the larger of two of the four next multiples of ten above the price."""
    above = [p for p in PRICE_STEPS if p > price][:4]
    return max(rng.sample(above, 2)) if len(above) >= 2 else NO_PRICE_BOUND


def instruction_suffix(options: dict[str, str], price_upper: float) -> str:
    """The option and price part of a WebShop synthetic instruction."""
    opt = ", and ".join(f"{k}: {v}" for k, v in options.items())
    text = f" with {opt}" if opt else ""
    if price_upper < NO_PRICE_BOUND:
        text += f", and price lower than {price_upper:.2f} dollars"
    return text


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        n = rng.randrange(len(_ASIN_CHARS) ** 8)
        asin = "B0" + "".join(_ASIN_CHARS[(n // len(_ASIN_CHARS) ** i) % len(_ASIN_CHARS)] for i in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _product(rng: random.Random, cat: _Category, typ: _Type, asin: str) -> Product:
    attrs = rng.sample(typ.attrs, rng.randint(2, 3)) + rng.sample(cat.attrs, rng.randint(1, 2))
    options = {}
    for name, pool, lo, hi in typ.options:
        picked = set(rng.sample(range(len(pool)), rng.randint(lo, min(hi, len(pool)))))
        options[name] = tuple(v for i, v in enumerate(pool) if i in picked)  # keep the pool's order
    brand = rng.choice(cat.brands)
    title = f"{brand} {rng.choice(cat.styles)} {attrs[0].title()} {typ.title}"
    lo, hi = typ.price
    if rng.random() < 0.1:  # a price range, like WebShop's "$a to $b" listings
        a, b = sorted(round(rng.uniform(lo, hi), 2) for _ in range(2))
        price, tag = round(rng.uniform(a, b), 2), f"${a:.2f} to ${b:.2f}"
    else:
        price = round(rng.uniform(lo, hi), 2)
        tag = f"${price:.2f}"
    description = (f"{brand} {typ.title.lower()}. Key qualities: {', '.join(attrs)}. "
                   + " ".join(rng.sample(cat.sentences, 2)))
    bullets = tuple(f"{a.capitalize()}: {rng.choice(_BENEFITS)}" for a in attrs) + (rng.choice(cat.sentences),)
    reviews = tuple(Review(rng.choice(_REVIEW_TITLES), rng.choice((1, 2, 3, 4, 4, 5, 5, 5)),
                           rng.choice(_REVIEW_BODIES)) for _ in range(rng.randint(0, 3)))
    rating = f"{sum(r.score for r in reviews) / len(reviews):.1f}" if reviews else "N.A."
    return Product(asin=asin, title=title, price=price, price_tag=tag, category=cat.name, query=typ.query,
                   product_category=f"{cat.root} › {typ.path}", type_nouns=typ.nouns, attributes=tuple(attrs),
                   options=options, description=description, bullet_points=bullets, reviews=reviews, rating=rating)


def _goal(rng: random.Random, product: Product) -> Goal:
    attrs = rng.sample(product.attributes, rng.randint(2, min(3, len(product.attributes))))
    options = {name: rng.choice(product.options[name]) for name in sorted(product.options)}
    price_upper = price_upper_for(product.price, rng)
    text = rng.choice(_INSTRUCTIONS).format(a=_join(attrs), t=product.query)
    return Goal(asin=product.asin, instruction_text=text + instruction_suffix(options, price_upper),
                attributes=tuple(attrs), goal_options=tuple(options.values()), price_upper=price_upper,
                query=product.query, product_category=product.product_category, type_nouns=product.type_nouns)


def generate(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0) -> tuple[list[Product], list[Goal]]:
    """Products (types dealt round-robin) and one goal per product, goals shuffled."""
    if num_products < 1:
        raise ValueError(f"num_products must be >= 1, got {num_products}")
    rng = random.Random(seed)
    types = [(cat, typ) for cat in CATEGORIES for typ in cat.types]
    taken: set[str] = set()
    products = [_product(rng, *types[i % len(types)], _asin(rng, taken)) for i in range(num_products)]
    rng.shuffle(products)
    goals = [_goal(rng, p) for p in products]
    rng.shuffle(goals)
    return products, goals


@lru_cache(maxsize=4)
def synthetic_catalog(num_products: int = DEFAULT_NUM_PRODUCTS, seed: int = 0) -> Catalog:
    """The synthetic catalogue, built once per (size, seed) in this process."""
    products, goals = generate(num_products, seed)
    return Catalog(products, goals, name=f"synthetic-{num_products}-seed{seed}", synthetic=True)
